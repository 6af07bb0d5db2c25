"""policy_check's answer on planted figures: goodput under the SLOs, the static rule judged
against picked without the repetition it is judged on, and each verdict (better, worse, as
good inside the margin, undecided) where the planted truth says."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.questions.policy_check import MARGIN, cells_of, compare

pytestmark = pytest.mark.unit

LOADS = (1, 2, 4)
REPS = 5


def planted(policy_factor: dict[int, float], noise: float = 0.01, seed: int = 0) -> pd.DataFrame:
    """Cells whose TTFT p90 is 100 ms x load for pull, 10% more for the other static rules,
    and ``policy_factor[load]`` x pull's for the policy, each with ``noise`` (relative SD)
    shared by a repetition's flows (the same conversations) plus its own."""
    rng = np.random.default_rng(seed)
    rows = []
    for load in LOADS:
        for rep in range(REPS):
            common = rng.normal(0, noise)
            truth = {"recompute": 1.1, "pull": 1.0, "static_light": 1.1, "static_heavy": 1.1}
            truth["policy"] = policy_factor[load]
            for flow, factor in truth.items():
                ttft = 100.0 * load * factor * (1 + common + rng.normal(0, noise / 3))
                rows.append(
                    {
                        "load": load,
                        "flow": flow,
                        "repetition": rep,
                        "ttft_p90": ttft,
                        "goodput": min(1.0, 80.0 * load / ttft),
                    }
                )
    return pd.DataFrame(rows)


def verdicts(cells: pd.DataFrame, metric: str) -> dict:
    return {c.load: c.verdict for c in compare(cells, metric)}


def test_a_policy_faster_where_the_load_is_high_is_better_there_and_as_good_elsewhere():
    cells = planted({1: 1.0, 2: 1.0, 4: 0.8})
    got = {c.load: c for c in compare(cells, "TTFT p90")}
    assert got[1].verdict == got[2].verdict == "as good"
    assert got[4].verdict == "better"
    assert got[4].difference.value == pytest.approx(-0.2, abs=0.02)
    assert got[4].difference.high < 0
    # pull is the best static rule at every load: always the one judged against
    assert got[4].against == {"pull": REPS}
    assert got[None].verdict == "better"  # over all loads: -6.7% on average
    assert "better by" in got[4].sentence() and "pull x5" in got[4].sentence()


def test_a_slower_policy_is_worse_and_a_noisy_one_undecided():
    assert verdicts(planted({1: 1.3, 2: 1.3, 4: 1.3}), "TTFT p90")[4] == "worse"
    noisy = planted({1: 1.0, 2: 1.0, 4: 1.0}, noise=0.3, seed=3)
    got = {c.load: c for c in compare(noisy, "TTFT p90")}
    undecided = [c for c in got.values() if c.verdict == "undecided"]
    assert undecided, {k: c.verdict for k, c in got.items()}
    for c in undecided:  # an interval that holds 0 but leaves the margin is no equivalence
        assert c.difference.low < 0 < c.difference.high
        assert c.difference.low < -MARGIN or c.difference.high > MARGIN


def test_goodput_compares_shares_higher_is_better():
    got = {c.load: c for c in compare(planted({1: 1.0, 2: 1.0, 4: 0.8}), "goodput")}
    assert got[4].verdict == "better" and got[4].difference.value > 0
    assert got[1].verdict == "as good"


def test_the_pick_leaves_out_the_repetition_it_is_judged_on():
    """Two static rules equal in truth, one luckier on repetition 0 alone: on repetition 0
    the policy is judged against the other (the pick never sees repetition 0's luck)."""
    rows = []
    for rep in range(3):
        for flow, ttft in (("pull", 100.0), ("recompute", 100.0), ("policy", 100.0)):
            if flow == "pull":
                ttft = 50.0 if rep == 0 else 101.0
            rows.append({"load": 1, "flow": flow, "repetition": rep, "ttft_p90": ttft})
    cells = pd.DataFrame(rows).assign(goodput=1.0)
    (over, at_1) = compare(cells, "TTFT p90")
    # rep 0: recompute (the other reps favour it: 100 < 101); reps 1, 2: pull (mean 75.5)
    assert at_1.against == {"recompute": 1, "pull": 2}


def test_cells_count_goodput_under_both_slos_and_failed_turns_against_it():
    req = pd.DataFrame(
        {
            "point_id": ["a"] * 5,
            "flow": ["policy"] * 5,
            "repetition": [0] * 5,
            "turn": [1, 2, 2, 3, 3],
            "status": ["ok", "ok", "ok", "ok", "failed"],
            "ttft_ms": [9999.0, 100.0, 300.0, 150.0, float("nan")],
            "tpot_ms": [1.0, 10.0, 10.0, 50.0, 0.0],
            "path": ["recompute", "pull", "recompute_policy", "pull", ""],
        }
    )
    pts = pd.DataFrame(
        {"point_id": ["a"], "concurrency": [2], "started_at": [10.0], "finished_at": [12.0]}
    )
    (row,) = cells_of(req, pts, {"ttft_ms": 200.0, "tpot_ms": 20.0}).to_dict("records")
    # turns >= 2: 4; met: only the 100 ms / 10 ms one (300 ms too slow, 50 ms TPOT, failed)
    assert row["turns"] == 4 and row["goodput"] == pytest.approx(0.25)
    assert row["goodput_rps"] == pytest.approx(0.5)  # 1 turn over 2 s
    assert row["pulled"] == pytest.approx(0.5)
    assert row["load"] == 2
    unbounded = cells_of(req, pts, {"ttft_ms": 0.0, "tpot_ms": 0.0}).iloc[0]
    assert unbounded["goodput"] == pytest.approx(0.75)  # every ok turn; the failed one not


def test_an_open_loop_compares_per_offered_rate():
    from analysis.questions.policy_check import load_name, load_of

    closed = pd.DataFrame({"arrival": ["waves"], "request_rate": [0.0], "concurrency": [4]})
    opened = pd.DataFrame({"arrival": ["poisson"], "request_rate": [8.0], "concurrency": [4]})
    assert (load_name(closed), load_of(closed.iloc[0])) == ("concurrency", 4.0)
    assert (load_name(opened), load_of(opened.iloc[0])) == ("offered turns/s", 8.0)
