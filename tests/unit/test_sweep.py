"""One sweep model (``pdbench.plan.sweep``): a ``-m`` sweep's compositions that differ only in
axis values fold into one, those that differ only in their workload measure on one start of
their servers (local and SLURM alike), anything else keeps a launch of its own."""

from __future__ import annotations

import pytest

from pdbench.cli import UsageError, parse_argv, precheck, submits_now
from pdbench.config.compose import compose_job
from pdbench.config.schema import ClientApi, Command, ExecutorKind, Flow, HistoryEdit, RunConfig
from pdbench.driver.launch import finish_sweep
from pdbench.plan.deployments import make_plan
from pdbench.plan.sweep import Composition, fold, merged, plan_sweep, share_key
from pdbench.spec.launch import build_launch
from tests.unit.helpers import cpu_run
from tests.unit.test_cli import pdbench

pytestmark = pytest.mark.unit


def chat_run():
    cfg = cpu_run()
    cfg.workload.api = ClientApi.chat
    return cfg


def launches(*cfgs):
    return plan_sweep(fold(list(cfgs)))


def test_compositions_that_differ_in_axis_values_only_fold_into_one():
    ones = []
    for concurrency in (1, 4):
        for ttl in (20, 60):
            cfg = cpu_run()
            cfg.workload.concurrency, cfg.flow.decoder_kv_blocks_ttl_s = [concurrency], [ttl]
            ones.append(cfg)
    (comp,) = fold(ones)
    assert comp.members == [0, 1, 2, 3]
    assert comp.cfg.workload.concurrency == [1, 4] and comp.cfg.flow.decoder_kv_blocks_ttl_s == [
        20,
        60,
    ]
    listed = cpu_run()  # the same sweep written as lists: the same plan
    listed.workload.concurrency, listed.flow.decoder_kv_blocks_ttl_s = [1, 4], [20, 60]
    assert make_plan(comp.cfg).points == make_plan(listed).points
    assert ones[0].workload.concurrency == [1]  # the compositions are left as they were


def test_a_search_over_loads_folds_into_one_search():
    cfgs = [cpu_run(), cpu_run()]
    for cfg, load in zip(cfgs, (1, 4), strict=True):
        cfg.workload.history_tokens, cfg.workload.concurrency = [], [load]
        cfg.flow.flows = [Flow.recompute, Flow.pull]
    (launch,) = launches(*cfgs)
    (search,) = launch.plan.searches.values()
    assert list(search.loads) == [1, 4]


def test_runs_that_differ_in_their_workload_share_servers_and_others_do_not():
    other_server = cpu_run()
    other_server.server.max_num_seqs = 8
    found = launches(cpu_run(), other_server, chat_run())
    assert [launch.members for launch in found] == [[0, 2], [1]]
    longer = cpu_run()
    longer.workload.history_tokens = [0, 512]  # an axis: folded with the first
    found = launches(cpu_run(), chat_run(), longer)
    assert [launch.members for launch in found] == [[0, 2, 1]]


@pytest.mark.parametrize("executor", [ExecutorKind.local, ExecutorKind.slurm])
def test_a_slurm_sweep_shares_servers_as_a_local_one_does(executor):
    cfgs = [cpu_run(), chat_run()]
    for cfg in cfgs:
        cfg.cluster.executor = executor
    (launch,) = launches(*cfgs)
    (dep,) = launch.plan.deployments
    assert len(launch.plan.points[dep.deployment_id]) == 2 * len(
        make_plan(cfgs[0]).points[dep.deployment_id]
    )


@pytest.mark.parametrize(
    "change",
    [
        lambda c: setattr(c.workload, "history_tokens", []),  # a search picks its Points
        lambda c: setattr(c, "dir", "/ANOTHER"),  # another run dir
        lambda c: setattr(c.workload, "request_timeout_s", 30.0),  # the router's: in the spec
        lambda c: setattr(c.server, "block_size", 16),  # other servers
        lambda c: setattr(c.cluster, "executor", ExecutorKind.slurm),  # where they run
    ],
)
def test_what_never_shares(change):
    cfg = chat_run()
    change(cfg)
    assert [launch.members for launch in launches(cpu_run(), cfg)] == [[0], [1]]


def test_a_deployment_axis_value_of_another_composition_adds_its_deployment():
    other = chat_run()
    other.flow.kv_recompute_threshold = [1024]
    (launch,) = launches(cpu_run(), other)
    assert [d.kv_recompute_threshold for d in launch.plan.deployments] == [64, 1024]


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
        lambda w: setattr(w, "request_rate", 2.0),
        lambda w: setattr(w, "turns", 6),
        lambda w: setattr(w, "seed", 7),
    ],
)
def test_compositions_that_share_have_the_same_launch_spec_but_for_the_points(change):
    # The rule is the key; what makes sharing safe is that the servers, router and preflight
    # the later composition would have started are the ones the first one starts.
    cfg, other = cpu_run(), cpu_run()
    change(other.workload)
    assert share_key(cfg) == share_key(other)
    (launch,) = plan_sweep([Composition(cfg, [0]), Composition(other, [1])])
    other_plan = make_plan(other)
    assert _spec_without_points(cfg, launch.plan) == _spec_without_points(other, other_plan)
    assert _spec_without_points(cfg, launch.plan) == _spec_without_points(cfg, make_plan(cfg))


def test_the_first_composition_s_points_run_first_then_the_others_each_once():
    plan, other = make_plan(cpu_run()), make_plan(chat_run())
    (dep_id,) = plan.points
    both = merged(plan, other)
    ids = [p.point_id for p in both.points[dep_id]]
    assert ids == [p.point_id for p in plan.points[dep_id] + other.points[dep_id]]
    assert len(set(ids)) == len(ids)  # the chat Points are Points of their own
    assert {p.workload.api for p in both.points[dep_id][len(plan.points[dep_id]) :]} == {
        ClientApi.chat
    }
    assert merged(both, other).points == both.points  # each Point once
    assert plan.points[dep_id] == make_plan(cpu_run()).points[dep_id]  # plan left as it was
    spec = build_launch(cpu_run(), both, "/model").deployments[0]
    assert spec.run_order == ids  # the job runs them in that order


def test_a_dry_run_shows_the_whole_sweep_as_one_table(tmp_path):
    run_dir = tmp_path / "run"
    args = ["-m", "+experiment=smoke", "workload.concurrency=1,4", "workload.api=completions,chat"]
    out = pdbench(*args, f"dir={run_dir}", "launch.dry_run=true")
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[:3]
    assert head[0].startswith("sweep: 4 composition(s) -> 1 launch(es), 1 Deployment(s), ")
    assert "concurrency=1,4" in head[2]
    assert out.stdout.count("\ndeployment ") == 1  # one start of the servers, printed once
    assert not run_dir.exists()


def test_a_value_typed_for_an_axis_is_measured_never_dropped():
    # A preset's list and a value typed on the command line: the value replaces the list (it
    # once ran TTL 8 s and 20 s when 3 s was asked)
    cfg = compose_job(["+experiment=decode_cost", "flow.decoder_kv_blocks_ttl_s=[3]"])
    assert [d.decoder_kv_blocks_ttl_s for d in make_plan(cfg).deployments] == [3]
    inv = parse_argv(["+experiment=decode_cost", "workload.concurrency=2"])
    assert "workload.concurrency=[2]" in inv.overrides
    (job,) = precheck(inv)
    assert job.cfg.workload.concurrency == [2]


def test_an_axis_with_no_value_is_refused():
    with pytest.raises(UsageError) as info:
        precheck(parse_argv(["+experiment=smoke", "workload.concurrency=[]"]))
    assert "workload.concurrency=[]: has no value: nothing would be measured" in str(info.value)
    (job,) = precheck(parse_argv(["+experiment=crossover", "workload.history_tokens=[]"]))
    assert job.cfg.workload.history_tokens == []  # the crossover search


def test_a_sweep_submits_now_only_slurm_runs():
    cfg = RunConfig(dir="/r", cache_dir="/c")
    assert not submits_now(cfg)  # local: one composition after another
    cfg.cluster.executor = ExecutorKind.slurm
    assert submits_now(cfg)
    cfg.launch.dry_run = True
    assert not submits_now(cfg)
    cfg.launch.dry_run, cfg.command = False, Command.status
    assert not submits_now(cfg)
    assert finish_sweep([])  # nothing submitted: nothing to follow
