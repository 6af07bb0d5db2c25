"""The dry run says how many Points one SLURM attempt holds: the time limit less the
checkpoint's signal and the servers' start, over a Point's measured or estimated duration."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdbench.cli import compose_job
from pdbench.plan.attempt import (
    DECODE_STEP_S,
    POINT_OVERHEAD_S,
    Attempt,
    attempt,
    attempt_line,
    estimated_point_s,
    median_point_s,
)
from pdbench.plan.deployments import make_plan
from pdbench.plan.prefill_wave import prefill_seconds
from pdbench.results.store import RunStore
from records.point import PointResult, PointStatus

pytestmark = pytest.mark.unit

GPU = ["cluster=h100_8gpu", "model=llama3_8b", "model.path=/shared/x", "transport=nvlink"]


def test_the_points_an_attempt_holds_follow_from_its_time_after_the_servers_start():
    a = Attempt(240 * 60, 120, 1800, 60.0, "measured", job_points=600)
    assert a.measuring_s == 12480 and a.points == 208
    line = a.describe()
    assert "time limit 240 min, less 120 s for the checkpoint (USR2) and up to 1800 s" in line
    assert "leaves 12480 s to measure; a Point takes about 60 s (measured)" in line
    assert (
        "about 208 Point(s) per attempt, so a job of 600 Point(s) needs about 3 attempt(s)" in line
    )


def test_an_attempt_that_holds_no_point_says_the_time_limit_that_would():
    line = Attempt(30 * 60, 120, 1800, 11.0, "rough", job_points=3).describe()
    assert "no Point fits" in line and line.endswith("Fix: cluster.time_limit_min=34 or more")


def test_without_a_gpu_figure_or_records_the_count_is_unknown_and_says_what_gives_one():
    cfg = compose_job(["+experiment=smoke", "cluster=slurm"])
    a = attempt(cfg, 0, 12)
    assert a.points is None
    assert "Points per attempt unknown" in a.describe()
    assert "cluster.gpu_tflops=<one GPU's dense TFLOPS>" in a.describe()


def test_the_rough_estimate_is_each_turns_prefill_wave_and_decode_steps():
    cfg = compose_job(["+experiment=smoke", *GPU])
    w, p = cfg.workload, cfg.topology.prefill
    expected = POINT_OVERHEAD_S
    for turn in range(1, w.turns + 1):
        context = turn * w.user_tokens + (turn - 1) * w.output_tokens
        expected += w.concurrency[0] * prefill_seconds(cfg.model, context, p.tp, 989.0)
        expected += w.output_tokens * DECODE_STEP_S
    assert estimated_point_s(cfg, 0) == pytest.approx(expected)
    assert estimated_point_s(cfg, 32768) > estimated_point_s(cfg, 0)
    assert "rough estimate" in attempt(cfg, 0, 12).basis


def test_points_already_recorded_give_the_measured_median_instead():
    records = [
        PointResult(str(i), PointStatus(status), "", "pull", {}, {}, started_at=a, finished_at=b)
        for i, (status, a, b) in enumerate(
            [("ok", 100.0, 140.0), ("ok", 200.0, 260.0), ("failed", 300.0, 900.0), ("ok", 0, 0)]
        )
    ]
    assert median_point_s(records) == 50.0
    assert median_point_s([]) is None
    cfg = compose_job(["+experiment=smoke", *GPU])
    a = attempt(cfg, 0, 12, measured_point_s=50.0)
    assert a.point_s == 50.0 and "median of the Points this dir recorded" in a.basis


def test_the_dry_runs_line_counts_the_largest_job(tmp_path: Path):
    cfg = compose_job(["+experiment=smoke", *GPU, f"dir={tmp_path}"])
    plan = make_plan(cfg)
    line = attempt_line(cfg, plan, RunStore(tmp_path).iter_points())
    points = max(len(p) for p in plan.points.values())
    assert line.startswith("each SLURM attempt: time limit 240 min")
    assert f"a job of {points} Point(s) needs about 1 attempt(s)" in line
