"""What the run loop measures next: the plan's Points in run order, those recorded ok
skipped (a resumed or requeued run measures every Point once)."""

from __future__ import annotations

import pytest

from jobs.run.next_points import PlannedPoints
from pdbench.plan.deployments import make_plan
from pdbench.results.store import RunStore
from records.point import PointResult, PointStatus
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit


def planned(tmp_path):
    cfg = cpu_run(dir=str(tmp_path))
    plan = make_plan(cfg)
    return plan.points[plan.deployments[0].deployment_id], RunStore(cfg.dir)


def drain(source) -> list[str]:
    out = []
    while (point := source.next_point([])) is not None:
        out.append(point.point_id)
    return out


def test_points_come_in_the_launch_specs_run_order(tmp_path):
    points, store = planned(tmp_path)
    order = [p.point_id for p in reversed(points)]
    source = PlannedPoints(points, order, store)
    assert drain(source) == order and source.recorded == []
    assert source.warm_up_points() == source.points
    first = source.points[0]
    assert source.label(first).startswith(f"[1/{len(points)}] {first.flow.value} h=")


def test_points_recorded_ok_are_skipped_and_need_no_warm_up(tmp_path):
    points, store = planned(tmp_path)
    done = points[0]
    store.write_point(PointResult(done.point_id, PointStatus.ok, "", done.flow.value, {}, {}), [])
    source = PlannedPoints(points, [p.point_id for p in points], store)
    assert source.recorded == [done.point_id]
    assert drain(source) == [p.point_id for p in points[1:]]
    for p in points[1:]:
        store.write_point(PointResult(p.point_id, PointStatus.ok, "", p.flow.value, {}, {}), [])
    assert PlannedPoints(points, [], store).warm_up_points() == []
