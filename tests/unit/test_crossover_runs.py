"""benchmarks/crossover_effect: the runs' verdicts read back from summary.json, and the
lengths every run's crossover interval holds (the "do reruns agree?" check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.crossover_effect import common_interval, verdicts

pytestmark = pytest.mark.unit


def run(low: float | None, high: float | None) -> dict:
    v = None if low is None else {"crossover_low": low, "crossover_high": high}
    return {"verdicts": v}


def test_the_common_interval_is_what_every_run_holds():
    assert common_interval([run(155, 258), run(173, 275), run(155, 275)]) == [173, 258]


def test_runs_that_disagree_beyond_their_intervals_share_nothing():
    assert common_interval([run(87, 150), run(173, 275)]) is None


def test_one_analysed_run_is_no_comparison():
    assert common_interval([run(87, 150), run(None, None)]) is None


def test_verdicts_come_from_the_analysis_summary(tmp_path: Path):
    assert verdicts(tmp_path) is None  # not analysed yet
    (tmp_path / "analysis").mkdir()
    summary = {
        "questions": {
            "crossover": [
                {
                    "measured": {
                        "tokens": 205.0,
                        "low": 155.0,
                        "high": 258.0,
                        "verdict": "decided",
                    },
                    "recommended_kv_recompute_threshold": 224,
                }
            ],
            "control": [
                {
                    "pull_minus_recompute": {"estimate": 0.7, "low": -1.7, "high": 3.2},
                    "invalid": False,
                    "text": "A/A control ... passes",
                }
            ],
        }
    }
    (tmp_path / "analysis" / "summary.json").write_text(json.dumps(summary))
    v = verdicts(tmp_path)
    assert (v["crossover_tokens"], v["crossover_low"], v["crossover_high"]) == (205, 155, 258)
    assert v["recommended_kv_recompute_threshold"] == 224
    assert (v["control_ms"], v["control_invalid"]) == (0.7, False)
