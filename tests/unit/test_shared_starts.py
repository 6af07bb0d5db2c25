"""Jobs of a ``-m`` sweep that differ only in their workload measure on one start of their
servers; anything else that differs keeps a start of its own."""

from __future__ import annotations

import pytest

from pdbench.config.schema import ClientApi, ExecutorKind, HistoryEdit
from pdbench.plan.deployments import make_plan
from pdbench.plan.shared_starts import (
    dry_run_line,
    later_jobs,
    share_servers,
    sharing_key,
    with_points_of,
)
from pdbench.spec.launch import build_launch
from tests.unit.helpers import cpu_run
from tests.unit.test_cli import pdbench

pytestmark = pytest.mark.unit


def chat_run():
    cfg = cpu_run()
    cfg.workload.api = ClientApi.chat
    return cfg


def test_jobs_that_differ_in_their_workload_only_go_to_the_first_of_them():
    other_server = cpu_run()
    other_server.server.max_num_seqs = 8
    assert later_jobs([cpu_run(), other_server, chat_run()]) == [[2], [], []]
    longer = cpu_run()
    longer.workload.history_tokens = [0, 512]
    assert later_jobs([cpu_run(), chat_run(), longer]) == [[1, 2], [], []]


@pytest.mark.parametrize(
    "change",
    [
        lambda c: setattr(c.launch, "dry_run", True),  # a dry run shares with dry runs only
        lambda c: setattr(c.cluster, "executor", ExecutorKind.slurm),  # side by side there
        lambda c: setattr(c.workload, "history_tokens", []),  # a search picks its Points
        lambda c: setattr(c, "dir", "/ANOTHER"),  # another run dir
        lambda c: setattr(c.workload, "request_timeout_s", 30.0),  # the router's: in the spec
        lambda c: setattr(c.flow, "decoder_kv_blocks_ttl_s", 20),  # another Deployment
    ],
)
def test_what_never_shares(change):
    cfg = chat_run()
    change(cfg)
    assert later_jobs([cpu_run(), cfg]) == [[], []]
    first = cpu_run()
    change(first)
    if first.dir == "/RUN" and first.workload.history_tokens == [0]:
        return  # both changed alike: they may share
    if sharing_key(first) is None:  # SLURM, searches: not even among themselves
        assert later_jobs([first, cfg]) == [[], []]


def test_a_dry_run_of_the_sweep_shares_as_its_run_would(tmp_path):
    dry, dry_chat = cpu_run(), chat_run()
    for cfg in (dry, dry_chat):
        cfg.launch.dry_run = True
    assert later_jobs([dry, dry_chat]) == [[1], []]
    assert dry_run_line(0, [[1], []]) is None  # the first job prints its plan
    assert dry_run_line(1, [[1], []]).startswith("sweep job 2: its Points run on the servers ")
    # The command line: one deployment printed, with the later job's Points; no second one.
    run_dir = tmp_path / "run"
    args = ["-m", "+experiment=smoke", "workload.api=completions,chat", f"dir={run_dir}"]
    out = pdbench(*args, "launch.dry_run=true")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("deployment ") == pdbench(
        "+experiment=smoke", f"dir={run_dir}", "launch.dry_run=true"
    ).stdout.count("deployment ")
    assert "[pdbench] sweep: the " in out.stdout and "workload.api=chat run on these servers" in (
        out.stdout
    )
    assert "sweep job 2: its Points run on the servers of sweep job 1" in out.stdout
    assert not run_dir.exists()


def _spec_without_points(cfg, plan):
    (spec,) = build_launch(cfg, plan, "/model").deployments
    data = spec.to_dict()
    data.pop("run_order")
    return data


@pytest.mark.parametrize(
    "change",
    [
        lambda w: setattr(w, "api", ClientApi.chat),
        lambda w: setattr(w, "history_edit", HistoryEdit.mixed),
        lambda w: setattr(w, "history_tokens", [0, 256, 1024]),
        lambda w: setattr(w, "concurrencies", [1, 4]),
        lambda w: setattr(w, "request_rate", 2.0),
        lambda w: setattr(w, "turns", 6),
        lambda w: setattr(w, "seed", 7),
    ],
)
def test_jobs_that_share_have_the_same_launch_spec_but_for_the_points(change):
    # The rule is the key; what makes sharing safe is that the servers, router and preflight
    # the later job would have started are the ones the first job starts.
    cfg, other = cpu_run(), cpu_run()
    change(other.workload)
    assert sharing_key(cfg) == sharing_key(other)
    plan, other_plan = make_plan(cfg), make_plan(other)
    assert plan.points.keys() == other_plan.points.keys()  # the same Deployment
    shared, _ = share_servers(plan, cfg, [other])
    assert _spec_without_points(cfg, shared) == _spec_without_points(other, other_plan)
    assert _spec_without_points(cfg, shared) == _spec_without_points(cfg, plan)


def test_the_first_job_measures_the_later_ones_points_after_its_own():
    plan, other = make_plan(cpu_run()), make_plan(chat_run())
    (dep_id,) = plan.points
    merged = with_points_of(plan, other)
    ids = [p.point_id for p in merged.points[dep_id]]
    assert ids == [p.point_id for p in plan.points[dep_id] + other.points[dep_id]]
    assert len(set(ids)) == len(ids)  # the chat Points are Points of their own
    theirs = merged.points[dep_id][len(plan.points[dep_id]) :]
    assert {p.workload.api for p in theirs} == {ClientApi.chat}
    assert with_points_of(merged, other).points == merged.points  # each Point once
    assert plan.points[dep_id] == make_plan(cpu_run()).points[dep_id]  # plan left as it was
    spec = build_launch(cpu_run(), merged, "/model").deployments[0]
    assert spec.run_order == ids  # the job runs them in that order


def test_a_launch_says_which_jobs_points_it_measures_too():
    cfg = cpu_run()
    plan = make_plan(cfg)
    (dep_id,) = plan.points
    own = len(plan.points[dep_id])
    shared, lines = share_servers(plan, cfg, [chat_run()])
    assert len(shared.points[dep_id]) == 2 * own
    assert lines == [
        f"sweep: the {own} Point(s) of its job with workload.api=chat run on these servers too"
    ]
    other_deployment = chat_run()
    other_deployment.flow.kv_recompute_threshold = 1024
    assert share_servers(plan, cfg, [other_deployment]) == (plan, [])
    assert share_servers(plan, cfg, []) == (plan, [])
    assert share_servers(shared, cfg, [chat_run()]) == (shared, [])  # each Point once
