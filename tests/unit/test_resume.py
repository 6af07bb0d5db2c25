"""A launch into a dir with records says what it skips and what it runs; the dry run lists
every Point and leaves the dir as it was."""

from __future__ import annotations

import json

import pytest

from pdbench.config.compose import compose_job
from pdbench.driver.run_dir import resume_lines, write_manifest
from pdbench.plan.deployments import make_plan
from pdbench.results.jsonable import to_jsonable
from pdbench.results.store import RunStore
from records.point import PointResult, PointStatus
from tests.unit.helpers import cpu_run, one_pass
from tests.unit.test_cli import pdbench

pytestmark = pytest.mark.unit


def record(store: RunStore, point, status: PointStatus) -> None:
    store.write_point(PointResult(point.point_id, status, "", point.flow.value, {}, {}), [])


def test_a_new_dir_lists_nothing_and_a_used_one_each_kind(tmp_path):
    plan = make_plan(one_pass(cpu_run(dir=str(tmp_path))))
    store = RunStore(tmp_path)
    assert resume_lines(plan, store, verbose=False) == []
    agg, recompute, pull = plan.all_points()
    record(store, agg, PointStatus.ok)
    record(store, recompute, PointStatus.failed)
    lines = resume_lines(plan, store, verbose=False)
    assert lines[0] == f"{tmp_path} holds records: 1 Point(s) recorded ok are skipped, 2 run"
    assert lines[1] == f"skipping 1 Point(s) recorded ok: {agg.point_id}"
    assert lines[2] == f"measuring again 1 Point(s) not ok: {recompute.point_id} (failed)"
    store.point_path(pull.point_id).write_text('{"status": "o')  # torn
    verbose = resume_lines(plan, store, verbose=True)
    assert verbose[1:] == [
        f"  skip {agg.point_id} (ok)",
        f"  run  {recompute.point_id} (failed)",
        f"  run  {pull.point_id} (corrupt)",
    ]


def test_the_dry_run_lists_the_points_it_would_skip_and_run_and_writes_nothing(
    tmp_path, monkeypatch
):
    monkeypatch.setattr("pdbench.driver.provenance.collect", lambda: {})
    run_dir = tmp_path / "run"
    cfg = compose_job(["+experiment=smoke", f"dir={run_dir}"])
    plan = make_plan(cfg)
    store = RunStore(run_dir)
    write_manifest([to_jsonable(cfg)], plan, store, "/model")
    agg, *rest = plan.all_points()  # the smoke preset measures several repetitions
    record(store, agg, PointStatus.ok)
    before = sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    out = pdbench("+experiment=smoke", f"dir={run_dir}", "launch.dry_run=true")
    assert out.returncode == 0, out.stderr
    head = f"{run_dir} holds records: 1 Point(s) recorded ok are skipped, {len(rest)} run:"
    assert head in out.stdout
    assert f"  skip {agg.point_id} (ok)" in out.stdout
    for point in rest:
        assert f"  run  {point.point_id} (pending)" in out.stdout
    assert sorted((p, p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before


def test_records_of_a_newer_pdbench_are_neither_resumed_nor_measured_over(
    tmp_path, capsys, monkeypatch
):
    from pdbench.driver.status import print_status

    monkeypatch.setattr("pdbench.driver.provenance.collect", lambda: {})
    run_dir = tmp_path / "run"
    cfg = compose_job(["+experiment=smoke", f"dir={run_dir}"])
    plan = make_plan(cfg)
    store = RunStore(run_dir)
    write_manifest([to_jsonable(cfg)], plan, store, "/model")
    agg, *_ = plan.all_points()
    newer = PointResult(agg.point_id, PointStatus.ok, "", "agg", {}, {}).to_dict()
    store.point_path(agg.point_id).parent.mkdir(parents=True, exist_ok=True)
    store.point_path(agg.point_id).write_text(json.dumps({**newer, "schema_version": 99}))
    out = pdbench("+experiment=smoke", f"dir={run_dir}", "launch.dry_run=true")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "holds records this pdbench cannot read:" in out.stderr
    assert "a point record of schema_version 99" in out.stderr and "Traceback" not in out.stderr
    print_status(str(run_dir))
    assert "a point record of schema_version 99; this pdbench reads up to" in (
        capsys.readouterr().out
    )
