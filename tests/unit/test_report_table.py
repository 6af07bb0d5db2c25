import pytest

from pdbench.driver.report_table import ttft_by_turn
from records.point import PointResult, PointStatus, TurnRow

pytestmark = pytest.mark.unit


def point(flow, h, rep, ttft, status="ok"):
    row = TurnRow(1, 4, h, h + 64, ttft, ttft, 64, 0, 0, 0)
    workload = {"history_tokens": h, "repetition": rep}
    return PointResult(f"{flow}-{h}-{rep}", PointStatus(status), "", flow, {}, workload,
                       repetition=rep, by_turn=[row])  # fmt: skip


def test_repetitions_share_a_column_with_the_median_of_their_medians():
    points = [point("pull", 0, 0, 10.0), point("agg", 0, 0, 5.0), point("pull", 0, 1, 30.0)]
    points += [point("pull", 0, 2, 20.0), point("agg", 0, 1, 7.0, status="failed")]
    flows, rows = ttft_by_turn(points)
    assert flows == ["pull", "agg"]  # in the order the run measured them first
    assert rows == [["1", "20 ms (computed 64, pulled 0, 3 reps)", "5 ms (computed 64, pulled 0)"]]


def test_history_lengths_get_their_own_columns():
    points = [point("pull", 512, 0, 9.0), point("pull", 64, 0, 4.0), point("agg", 64, 0, 3.0)]
    flows, _ = ttft_by_turn(points)
    assert flows == ["pull h=64", "pull h=512", "agg h=64"]
