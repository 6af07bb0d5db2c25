import pytest

from pdbench.config.schema import Flow, OnFailure, Placement
from pdbench.plan.deployments import SIDE_CHANNEL_STRIDE, cpu_cores, make_plan, share_budgets
from tests.unit.helpers import cpu_run, gpu_run, one_pass

pytestmark = pytest.mark.unit


def test_smoke_plan_one_deployment_three_points():
    plan = make_plan(one_pass(cpu_run()))
    assert len(plan.deployments) == 1
    dep = plan.deployments[0]
    assert [i.role for i in dep.instances] == ["prefill", "decode"]
    points = plan.points[dep.deployment_id]
    assert sorted(p.flow.value for p in points) == ["agg", "pull", "recompute"]
    assert [p.order_index for p in points] == [0, 1, 2]
    assert dep.bidirectional  # pull needs it


def test_cpu_instances_pinned_to_distinct_cores_and_ports():
    dep = make_plan(cpu_run()).deployments[0]
    p, d = dep.instances
    assert p.cpus == (0,) and d.cpus == (1,)
    assert p.http_port != d.http_port
    assert d.side_channel_port - p.side_channel_port == SIDE_CHANNEL_STRIDE
    assert dep.agg_instance is d  # no agg instance in 1p1d: agg runs on D


def test_cpu_tp_ranks_get_their_own_cores():
    cfg = cpu_run()
    cfg.cluster.cpus_per_node = 8
    cfg.server.cpu_threads_per_instance = 2
    cfg.topology.decode.tp = 2
    p, d = make_plan(cfg).deployments[0].instances
    assert p.cpus == (0, 1) and p.rank_cpus() == [(0, 1)]
    assert d.cpus == (2, 3, 4, 5) and d.rank_cpus() == [(2, 3), (4, 5)]
    assert d.side_channel_port - p.side_channel_port == SIDE_CHANNEL_STRIDE  # one per instance


def test_shared_cores_keep_p_alone_and_share_d_ranks():
    # 2 cores, P TP1 + D TP2 with cpu_share_cores: D's ranks share the core P leaves.
    cfg = cpu_run()
    cfg.topology.decode.tp = 2
    cfg.server.cpu_share_cores = True
    dep = make_plan(cfg).deployments[0]
    p, d = dep.instances
    assert p.rank_cpus() == [(0,)] and d.rank_cpus() == [(1,), (1,)]
    assert dep.nodes == 1


def test_shared_cores_split_by_ranks_and_never_mix_instances():
    assert share_budgets([1, 2], 1, 2) == [1, 1]  # P TP1 + D TP2 on 2 cores
    assert share_budgets([2, 4], 1, 2) == [1, 1]  # P TP2 + D TP4: one core each
    assert share_budgets([2, 4], 1, 6) == [2, 4]  # fits: nothing shared
    assert share_budgets([2, 8], 2, 4) == [2, 3]  # at least one rank's threads
    assert cpu_cores(0, 2, 1, 4, budget=2) == (0, 1)
    assert cpu_cores(3, 2, 1, 4, budget=2) == (3, 0)  # plan nodes of one host: wrap
    assert cpu_cores(1, 4, 1, 2, budget=1) == (1, 1, 1, 1)  # its own ranks share core 1
    cfg = cpu_run()
    cfg.topology.prefill.tp, cfg.topology.decode.tp = 2, 4
    cfg.server.cpu_share_cores = True
    p, d = make_plan(cfg).deployments[0].instances
    assert p.rank_cpus() == [(0,), (0,)] and d.rank_cpus() == [(1,)] * 4


def test_ttl_sweep_makes_deployments_and_working_set_and_load_make_points():
    cfg = one_pass(cpu_run())
    cfg.flow.decoder_kv_blocks_ttl_s = [10, 30]
    cfg.workload.conversations = [2, 8]
    cfg.workload.concurrency = [1, 4]
    plan = make_plan(cfg)
    assert [d.decoder_kv_blocks_ttl_s for d in plan.deployments] == [10, 30]
    assert [d.flow.decoder_kv_blocks_ttl_s for d in plan.deployments] == [[10], [30]]
    assert [d.deployment_id.split("-")[-2] for d in plan.deployments] == ["ttl10", "ttl30"]
    points = plan.points[plan.deployments[0].deployment_id]
    assert len(points) == 2 * 2 * 3  # conversations x concurrency x flows
    shapes = {(*p.workload.conversations, *p.workload.concurrency) for p in points}
    assert shapes == {(2, 1), (2, 4), (8, 1), (8, 4)}  # one value of each per Point
    assert len({p.point_id for p in plan.all_points()}) == 24
    # without the lists: one Deployment, named as before (no ttl suffix)
    assert make_plan(cpu_run()).deployments[0].deployment_id.split("-")[-2] == "t64"


def test_ids_are_stable_and_change_with_the_config():
    a = make_plan(cpu_run()).all_points()
    b = make_plan(cpu_run()).all_points()
    assert [p.point_id for p in a] == [p.point_id for p in b]
    cfg = cpu_run()
    cfg.workload.output_tokens += 1
    c = make_plan(cfg).all_points()
    assert {p.point_id for p in a}.isdisjoint({p.point_id for p in c})
    assert a[0].deployment_id == c[0].deployment_id  # workload is not a deployment axis


def test_history_sweep_and_threshold_sweep_expand():
    cfg = one_pass(cpu_run())
    cfg.workload.history_tokens = [0, 128, 512]
    cfg.flow.kv_recompute_threshold = [0, 64, 256]
    plan = make_plan(cfg)
    assert [d.kv_recompute_threshold for d in plan.deployments] == [0, 64, 256]
    assert len({d.deployment_id for d in plan.deployments}) == 3
    assert all(len(v) == 9 for v in plan.points.values())


def test_heterogeneous_tp_packs_gpus_on_one_node():
    dep = make_plan(gpu_run(p_tp=2, d_tp=4)).deployments[0]
    p, d = dep.instances
    assert (p.gpus, d.gpus) == ((0, 1), (2, 3, 4, 5))
    assert p.node == d.node == 0 and dep.nodes == 1


def test_cross_node_puts_decode_on_its_own_node():
    dep = make_plan(gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)).deployments[0]
    assert [(i.name, i.node, i.gpus) for i in dep.instances] == [
        ("prefill0", 0, (0,)),
        ("prefill1", 0, (1,)),
        ("decode0", 1, (0,)),
        ("decode1", 1, (1,)),
    ]
    assert dep.nodes == 2


def test_same_node_spills_when_full():
    dep = make_plan(gpu_run(p_tp=4, d_tp=8)).deployments[0]
    assert [(i.node, i.gpus) for i in dep.instances] == [(0, (0, 1, 2, 3)), (1, tuple(range(8)))]


def test_manifest_merges_deployments_of_a_multirun():
    from pdbench.driver.run_dir import merge_deployments

    first = make_plan(one_pass(cpu_run()))
    cfg = one_pass(cpu_run())
    cfg.workload.user_tokens = 48  # another workload on the same servers
    second = make_plan(cfg)
    merged = merge_deployments(merge_deployments([], first), second)
    assert len(merged) == 1
    assert len(merged[0]["points"]) == 6


def test_on_failure_stop_ends_the_run_only_after_a_failed_deployment(tmp_path):
    from pdbench.driver.progress import JobOutcome
    from pdbench.driver.run_dir import deployment_failed, stop_after
    from pdbench.results.store import RunStore, write_json_atomic
    from records.point import PointResult, PointStatus

    ran, failed_job = JobOutcome("1", result={}), JobOutcome("1", error="job failed")

    cfg = cpu_run()
    cfg.flow.kv_recompute_threshold = [0, 1024]
    plan = make_plan(cfg)
    first, second = plan.deployments
    store = RunStore(tmp_path)

    def record(point_id: str, status: PointStatus) -> dict:
        return PointResult(point_id, status, "", "pull", {}, {}).to_dict()

    for p in plan.points[first.deployment_id]:
        write_json_atomic(store.point_path(p.point_id), record(p.point_id, PointStatus.ok))
    assert not deployment_failed(plan, store, first, ran)
    assert deployment_failed(plan, store, first, failed_job)
    assert deployment_failed(plan, store, second, ran)  # its Points: pending
    one = plan.points[first.deployment_id][0]
    write_json_atomic(store.point_path(one.point_id), record(one.point_id, PointStatus.failed))
    assert deployment_failed(plan, store, first, ran)
    assert not stop_after(cfg, plan, store, first, ran)  # default: continue
    cfg.launch.on_failure = OnFailure.stop
    assert stop_after(cfg, plan, store, first, ran)


def design_plan(repetitions=3, histories=(64, 256, 1024), order_seed=0):
    cfg = cpu_run()
    cfg.workload.history_tokens = list(histories)
    cfg.workload.repetitions = repetitions
    cfg.workload.order_seed = order_seed
    return cfg, make_plan(cfg)


def test_run_order_is_a_permutation_of_every_point_in_complete_blocks():
    cfg, plan = design_plan()
    points = plan.all_points()
    flows = {Flow.agg, Flow.recompute, Flow.pull}
    cells = {(p.flow, p.history_tokens, p.repetition) for p in points}
    assert len(points) == len(cells) == 3 * 3 * 3  # flow x history x repetition, each once
    assert [p.order_index for p in points] == list(range(len(points)))
    blocks = [points[i : i + len(flows)] for i in range(0, len(points), len(flows))]
    for block in blocks:  # each block: one (history, repetition) with every flow
        assert {p.flow for p in block} == flows
        assert len({(p.history_tokens, p.repetition) for p in block}) == 1
    # flows shuffled within blocks, blocks shuffled (seed 0; all alike by chance: ~1e-6)
    assert len({tuple(p.flow for p in block) for block in blocks}) > 1
    keys = [(b[0].history_tokens, b[0].repetition) for b in blocks]
    assert keys != sorted(keys)


def test_run_order_is_seeded_reproducible_and_recorded():
    from pdbench.spec.launch import build_launch

    _, a = design_plan(order_seed=7)
    _, b = design_plan(order_seed=7)
    _, c = design_plan(order_seed=8)
    ids = [p.point_id for p in a.all_points()]
    assert ids == [p.point_id for p in b.all_points()]
    assert ids != [p.point_id for p in c.all_points()]
    assert sorted(ids) == sorted(p.point_id for p in c.all_points())  # the seed: order only
    cfg, plan = design_plan(order_seed=7)
    spec = build_launch(cfg, plan, "/models/m", [d.deployment_id for d in plan.deployments])
    (dep,) = spec.deployments
    assert dep.run_order == ids and dep.order_seed == 7


def test_repetitions_differ_in_seed_and_share_token_ids_across_flows():
    from jobs.workload import build_conversations

    _, plan = design_plan(repetitions=2, histories=(64,))
    points = plan.all_points()
    by_rep = {}
    for p in points:
        convs = build_conversations(p.workload, p.history_tokens, vocab_size=512)
        by_rep.setdefault(p.repetition, []).append((p.workload.seed, convs))
    seeds = {rep: {seed for seed, _ in runs} for rep, runs in by_rep.items()}
    assert all(len(s) == 1 for s in seeds.values()) and seeds[0] != seeds[1]
    for runs in by_rep.values():  # every flow of one repetition: the same conversations
        assert all(convs == runs[0][1] for _, convs in runs)
    assert by_rep[0][0][1][0].prefix != by_rep[1][0][1][0].prefix
    records = [p.workload_record() for p in points]
    assert {r["repetition"] for r in records} == {0, 1}
    assert all("repetitions" not in r and "order_seed" not in r for r in records)


def test_more_repetitions_keep_the_ids_of_those_measured():
    _, two = design_plan(repetitions=2)
    _, three = design_plan(repetitions=3)
    assert {p.point_id for p in two.all_points()} < {p.point_id for p in three.all_points()}
