"""benchmarks/seed_table.py: the seed benchmark's table from a flows run's records."""

from __future__ import annotations

import json

import pytest

from benchmarks.seed_table import load, markdown, table
from testbed.synthetic import write_synthetic_run

pytestmark = pytest.mark.unit


def test_the_table_is_per_prefix_caching_flow_and_turn_with_the_repetitions_range(tmp_path):
    root = write_synthetic_run(
        tmp_path / "run", histories=(4096,), turns=3, flows=("recompute", "pull"), bench=False
    )
    for path in (root / "points").glob("*.json"):  # one deployment with P's cache on
        point = json.loads(path.read_text())
        point["deployment"]["server"] = {"prefill_prefix_caching": True}
        path.write_text(json.dumps(point))
    points = load(root)
    result = table(points)
    assert set(result) == {"on"} and set(result["on"]) == {"recompute", "pull"}
    pull = result["on"]["pull"]
    assert set(pull["by_turn"]) == {1, 2, 3} and pull["routes"] == {"pull": 12}
    for c in (pull["all"], *pull["by_turn"].values()):
        assert c["low_ms"] <= c["p50_ms"] <= c["high_ms"]
    # a turn-2 pull costs less than a turn-2 recompute of 4,096+ tokens in the cost model
    assert pull["by_turn"][2]["p50_ms"] < result["on"]["recompute"]["by_turn"][2]["p50_ms"]
    text = markdown(result)
    assert "P's prefix caching on" in text and "| turn | recompute | pull |" in text
    assert "seed (Llama-3.3-70B, prefix caching off on P): TTFT p50 pull 219.6 ms" in text
