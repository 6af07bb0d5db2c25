"""Resume identity: ids cover what changes a measurement, not the knobs one raises after a
crash (pdbench/results/identity.py's table), and every setting is classified."""

from __future__ import annotations

import copy
import dataclasses
from enum import Enum
from typing import Any

import pytest

from analysis.load.runs import deployment_label, load_runs
from pdbench.config.schema import Arrival, Flow, OnFailure, RunConfig
from pdbench.driver.run_dir import pending_deployments
from pdbench.plan.deployments import Plan, make_plan
from pdbench.results.identity import (
    MEASURED_SECTIONS,
    OPERATIONAL,
    SWEEP_AXES,
    differences,
    measured_config,
)
from pdbench.results.jsonable import to_jsonable
from pdbench.results.store import RunStore
from records.point import PointResult, PointStatus, Summary
from tests.unit.helpers import cpu_run, one_pass

pytestmark = pytest.mark.unit

RAISED_AFTER_A_CRASH = {
    "server.startup_timeout_s": 900.0,
    "server.base_port": 9100,
    "server.side_channel_base_port": 6600,
    "server.router_port": 9000,
    "workload.request_timeout_s": 600.0,
}


def ids(plan: Plan) -> tuple[list[str], list[str]]:
    return [d.deployment_id for d in plan.deployments], [p.point_id for p in plan.all_points()]


def setting(cfg: RunConfig, dotted: str, value: Any) -> RunConfig:
    cfg = copy.deepcopy(cfg)
    *path, last = dotted.split(".")
    obj = cfg
    for part in path:
        obj = getattr(obj, part)
    setattr(obj, last, value)
    return cfg


def all_flows() -> RunConfig:
    cfg = cpu_run()
    cfg.flow.flows = [Flow.agg, Flow.recompute, Flow.pull, Flow.decode_first, Flow.policy]
    return cfg


@pytest.mark.parametrize("key", sorted(RAISED_AFTER_A_CRASH))
def test_operational_knobs_keep_every_id(key):
    before = ids(make_plan(all_flows()))
    after = ids(make_plan(setting(all_flows(), key, RAISED_AFTER_A_CRASH[key])))
    assert after == before, key


def test_tracking_cluster_and_paths_keep_every_id():
    cfg = all_flows()
    other = copy.deepcopy(cfg)
    other.dir, other.cache_dir, other.name = "/ELSEWHERE", "/OTHER_CACHE", "renamed"
    other.launch.on_failure = OnFailure.stop
    other.cluster.time_limit_min = 600
    assert ids(make_plan(other)) == ids(make_plan(cfg))


def _perturbed(value: Any) -> list[Any]:
    """Values different from ``value`` of the same type (one per nested field for records)."""
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, Enum):
        return [next(m for m in type(value) if m is not value)]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, float):
        return [value * 2 + 1.0]
    if isinstance(value, str):
        return [value + "x"]
    if isinstance(value, list):
        return [[*value, value[-1]] if value else ["--x"]]
    if isinstance(value, dict):
        return [{**value, "PDBENCH_X": "1"}]
    if value is None:  # an optional enum left unset (flow.serve)
        return [Flow.pull]
    raise TypeError(value)


def _leaf_settings(cfg: RunConfig) -> list[tuple[str, Any]]:
    """(dotted key, a different value) for every leaf field of the measured sections."""
    out = []

    def walk(obj: Any, prefix: str) -> None:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                walk(value, f"{prefix}.{f.name}")
            else:
                out.extend((f"{prefix}.{f.name}", v) for v in _perturbed(value))

    for section in MEASURED_SECTIONS:
        walk(getattr(cfg, section), section)
    return out


def test_every_setting_of_the_measured_sections_is_in_ids_or_declared_operational():
    """A new field is classified by this test: it changes an id, or the table says why not."""
    base = all_flows()
    before = ids(make_plan(base))
    for key, value in _leaf_settings(base):
        section, _, field = key.partition(".")
        after = ids(make_plan(setting(base, key, value)))
        if field.split(".")[0] in OPERATIONAL.get(section, ()):
            assert after == before, f"{key} is operational but changed an id"
        elif key in SWEEP_AXES:
            continue  # adds or removes Deployments/Points: each carries its own value
        else:
            assert after != before, f"{key} changes the measurement but no id"


def test_decode_first_knobs_change_only_decode_first_points():
    base = make_plan(all_flows())
    cfg = all_flows()
    cfg.flow.cache_hit_threshold = 0.5
    other = make_plan(cfg)
    changed = {
        a.flow
        for a, b in zip(base.all_points(), other.all_points(), strict=True)
        if a.point_id != b.point_id
    }
    assert changed == {Flow.decode_first}


def test_measured_config_leaves_out_operational_knobs_and_sweep_axes():
    cfg = cpu_run()
    other = setting(cfg, "server.startup_timeout_s", 900.0)
    other.workload.history_tokens = [0, 1024]
    assert measured_config(to_jsonable(other)) == measured_config(to_jsonable(cfg))
    other.server.block_size = 64
    assert differences(measured_config(to_jsonable(cfg)), measured_config(to_jsonable(other))) == [
        ("server.block_size", 32, 64)
    ]


def _record(store: RunStore, plan: Plan, point) -> None:
    dep = next(d for d in plan.deployments if d.deployment_id == point.deployment_id)
    summary = Summary(requests=2)
    summary.ttft_ms.p50 = summary.ttft_ms.mean = 10.0
    store.write_point(
        PointResult(
            point_id=point.point_id,
            status=PointStatus.ok,
            error="",
            flow=point.flow.value,
            deployment=dep.record(),
            workload=point.workload_record(),
            summary=summary,
            started_at=1.0,
            finished_at=2.0,
        ),
        [],
    )


def test_resume_with_raised_timeouts_skips_what_is_done_and_analysis_sees_one_deployment(
    tmp_path,
):
    store = RunStore(tmp_path)
    first = make_plan(one_pass(cpu_run()))
    _record(store, first, first.all_points()[0])  # then the run crashed
    raised = one_pass(cpu_run())
    for key, value in RAISED_AFTER_A_CRASH.items():
        raised = setting(raised, key, value)
    rerun = make_plan(raised)
    statuses = [store.point_status(p.point_id) for p in rerun.all_points()]
    assert statuses == [PointStatus.ok, PointStatus.pending, PointStatus.pending]
    assert pending_deployments(rerun, store) == [rerun.deployments[0].deployment_id]
    for point in rerun.all_points()[1:]:
        _record(store, rerun, point)
    data = load_runs([tmp_path], progress=None)
    dep_ids = sorted(data.points["deployment_id"].unique())
    assert dep_ids == [first.deployments[0].deployment_id]
    labels = {deployment_label(d, data.points) for d in dep_ids}
    assert len(labels) == 1 and len(data.points) == 3


def test_fields_added_later_at_their_implied_value_keep_older_ids():
    """A run dir recorded before workload.arrival/burstiness and flow.policy existed resumes:
    at the value those runs implied the fields are left out of ids and of the manifest's
    comparison; any other value is measured."""
    from pdbench.results.identity import ADDED_LATER, measured_config

    cfg = all_flows()
    record = to_jsonable(cfg)
    older = {s: dict(record[s]) for s in record if isinstance(record[s], dict)}
    for section, fields in ADDED_LATER.items():
        for name in fields:
            del older[section][name]
    assert measured_config(older) == measured_config(record)
    cfg.workload.arrival = Arrival.poisson
    cfg.workload.request_rate = 2.0
    assert "workload.arrival" in measured_config(to_jsonable(cfg))
    assert ids(make_plan(cfg)) != ids(make_plan(all_flows()))
