"""validate(): one test per class of problem; each names the field, the value and the fix."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pdbench.config.schema import (
    ClusterConfig,
    ExecutorKind,
    Flow,
    KvBufferDevice,
    LengthDistribution,
    Placement,
    RoleSpec,
    TopologyConfig,
)
from pdbench.validate.rules import ConfigError, ConfigProblem, check, validate, warnings
from tests.unit.helpers import cpu_run, gpu_run

pytestmark = pytest.mark.unit


def problems_for(cfg, field: str) -> list[ConfigProblem]:
    return [p for p in validate(cfg) if p.field == field]


def only(cfg, field: str, value, *words: str) -> ConfigProblem:
    """The one problem of ``field``; its line names field=value, the words and a fix."""
    found = problems_for(cfg, field)
    assert len(found) == 1, [str(p) for p in validate(cfg)]
    line = str(found[0])
    assert line.startswith(f"{field}={value}: "), line
    assert ". Fix: " in line and found[0].fix, line
    for word in words:
        assert word in line, (word, line)
    return found[0]


def test_valid_configs_have_no_problems():
    assert validate(cpu_run()) == []
    assert validate(gpu_run()) == []
    assert validate(gpu_run(p_tp=2, d_tp=4)) == []
    assert validate(gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)) == []
    check(cpu_run())  # no exception


def test_tp_must_divide_attention_heads():
    only(gpu_run(p_tp=3, d_tp=3), "topology.prefill.tp", 3, "num_attention_heads (32)")


def test_tp_must_divide_kv_heads_or_replicate_them_evenly():
    cfg = gpu_run(p_tp=4, d_tp=4)
    cfg.model = replace(cfg.model, num_attention_heads=24, num_kv_heads=6, head_dim=128)
    only(cfg, "topology.prefill.tp", 4, "num_kv_heads (6)")
    # More ranks than KV heads: vLLM replicates them when tp is a multiple of the KV heads.
    cfg.topology.prefill.tp = cfg.topology.decode.tp = 8
    only(cfg, "topology.prefill.tp", 8, "replicate")
    cfg.model = replace(cfg.model, num_attention_heads=32, num_kv_heads=2)
    assert problems_for(cfg, "topology.prefill.tp") == []


def test_one_tp_must_be_a_multiple_of_the_other_either_way():
    """vLLM's NIXL connector maps ranks both ways (tp_mapping.py, 0.32 and 0.33): P TP 4 to
    D TP 2 (fan-in) as well as 2 to 4; not 4 to 6, where neither divides the other."""
    assert problems_for(gpu_run(p_tp=4, d_tp=2), "topology.decode.tp") == []
    assert problems_for(gpu_run(p_tp=2, d_tp=4), "topology.decode.tp") == []
    cfg = gpu_run(p_tp=4, d_tp=6)
    cfg.model = replace(cfg.model, num_attention_heads=48, num_kv_heads=12, head_dim=128)
    cfg.cluster.gpus_per_node = 16
    p = only(cfg, "topology.decode.tp", 6, "neither is a multiple of the other", "tp_mapping.py")
    assert "a multiple or a divisor of 4" in p.fix


def test_instance_tp_must_fit_a_node():
    cfg = gpu_run(p_tp=16, d_tp=16)
    cfg.model = replace(cfg.model, num_attention_heads=64)
    only(cfg, "topology.prefill.tp", 16, "gpus_per_node (8)")


def test_instances_must_fit_the_nodes():
    # 2 x TP4 prefill + 2 x TP4 decode = 16 GPUs: two 8-GPU nodes, the cluster gives one.
    p = only(gpu_run(p_tp=4, d_tp=4, p=2, d=2), "cluster.nodes", 1, "2 nodes", "GPUs")
    assert p.fix.startswith("cluster.nodes=2")


def test_on_one_machine_more_nodes_is_no_fix():
    # The local executor runs every plan node on this machine: more "nodes" are the same
    # cores; the fix is to share them, or a real cluster.
    cfg = cpu_run()
    cfg.topology = TopologyConfig(name="p1_d2", prefill=RoleSpec(1, 1), decode=RoleSpec(1, 2))
    p = only(cfg, "cluster.nodes", 1, "2 nodes the topology 'p1_d2' needs")
    assert p.fix.startswith("server.cpu_share_cores=true (the ranks share this machine's 2 cores")
    assert "cluster=slurm with cluster.nodes=2" in p.fix


def test_cross_node_needs_two_nodes():
    cfg = gpu_run(placement=Placement.cross_node, nodes=1)
    only(cfg, "topology.placement", "cross_node", "cluster.nodes is 1")


def test_cpu_instances_must_fit_the_cores():
    cfg = cpu_run()
    cfg.server.cpu_threads_per_instance = 2  # 2 instances x 2 threads on 2 cores
    only(cfg, "server.cpu_threads_per_instance", 2, "needs 4 cores", "offers 2")
    cfg.server.cpu_threads_per_instance = 3
    assert any("exceeds the 2 cores" in str(p) for p in validate(cfg))


def test_cpu_tp_counts_a_core_set_per_rank(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 3)  # a local node is this machine
    cfg = cpu_run()
    cfg.topology = TopologyConfig(name="p1_d2", prefill=RoleSpec(1, 1), decode=RoleSpec(1, 2))
    cfg.cluster.cpus_per_node = 3  # P TP1 + D TP2: three ranks, one core each
    assert validate(cfg) == []
    cfg.cluster.cpus_per_node = 2
    p = only(cfg, "server.cpu_threads_per_instance", 1, "3 TP ranks needs 3 cores", "offers 2")
    assert "server.cpu_share_cores=true" in p.fix
    cfg.server.cpu_share_cores = True  # explicitly allowed: D's ranks share a core
    assert validate(cfg) == []


def test_one_cpu_instance_must_fit_a_node_unless_shared():
    cfg = cpu_run()
    cfg.topology = TopologyConfig(name="p1_d4", prefill=RoleSpec(1, 1), decode=RoleSpec(1, 4))
    cfg.cluster.cpus_per_node = 2
    only(cfg, "topology.decode.tp", 4, "needs 4 cores, one set per rank", "a node has 2")
    cfg.server.cpu_share_cores = True
    assert validate(cfg) == []


def test_kv_blocks_per_role_hold_one_sequence_and_fit_the_cpu_cache():
    cfg = cpu_run()  # max_model_len 2048, block 32: 64 blocks + 1 held back
    cfg.server.prefill_kv_blocks = 64
    only(cfg, "server.prefill_kv_blocks", 64, "cannot hold one sequence", "at least 65")
    cfg.server.prefill_kv_blocks = 128
    assert validate(cfg) == []
    # 1 GiB of tiny-model KV: 2 layers x 2 KV heads x 64 x 4 bytes x 2 = 2 KiB per token
    cfg.server.decode_kv_blocks = 16385
    only(cfg, "server.decode_kv_blocks", 16385, "16384 blocks", "cpu_kvcache_space_gb=1")
    cfg.server.decode_kv_blocks = -1
    only(cfg, "server.decode_kv_blocks", -1, "non-negative")


def test_pd_flows_need_prefill_and_decode():
    cfg = cpu_run()
    cfg.topology = TopologyConfig(
        name="agg", prefill=RoleSpec(0, 1), decode=RoleSpec(0, 1), agg=RoleSpec(1, 1)
    )
    cfg.flow.flows = [Flow.agg, Flow.pull]
    only(cfg, "flow.flows", "pull", "topology 'agg' has 0 prefill and 0 decode")
    cfg.flow.flows = [Flow.agg]
    assert validate(cfg) == []


def test_agg_needs_an_agg_or_decode_instance():
    cfg = cpu_run()
    cfg.topology = TopologyConfig(name="p_only", prefill=RoleSpec(1, 1), decode=RoleSpec(0, 1))
    cfg.flow.flows = [Flow.agg]
    only(cfg, "flow.flows", "agg", "agg instance or a decode instance")


def test_thresholds_in_range():
    cfg = cpu_run()
    cfg.flow.kv_recompute_threshold = [32, -5]
    cfg.flow.cache_hit_threshold = 1.5
    only(cfg, "flow.kv_recompute_threshold", -5, "non-negative")
    only(cfg, "flow.cache_hit_threshold", 1.5, "[0, 1]")


def test_decode_first_fallback_is_a_pd_flow():
    cfg = cpu_run()
    cfg.flow.decode_first_fallback = Flow.agg
    only(cfg, "flow.decode_first_fallback", "agg", "P/D flow")


def test_cpu_block_size_is_a_multiple_of_32():
    cfg = cpu_run()
    cfg.server.block_size = 16
    only(cfg, "server.block_size", 16, "multiple of 32", "vLLM-CPU")
    assert problems_for(gpu_run(), "server.block_size") == []  # block 16 on GPUs is fine


def test_cpu_head_size_and_buffer_device():
    cfg = cpu_run()
    cfg.model = replace(cfg.model, hidden_size=64)  # head_dim 16
    cfg.transport.kv_buffer_device = KvBufferDevice.cuda
    only(cfg, "model.head_dim", 16, "vLLM-CPU")
    only(cfg, "transport.kv_buffer_device", "cuda", "gpus_per_node is 0")


def test_workload_must_fit_the_context():
    cfg = cpu_run()
    cfg.workload.history_tokens = [0, 1900]
    only(cfg, "workload.history_tokens", 1900, "2220", "max_model_len (2048)")
    cfg.workload.history_tokens = [1000]
    cfg.workload.user_tokens_jitter = 0.5  # longest user message 96: 1000 + 4 x 112 fits
    assert problems_for(cfg, "workload.history_tokens") == []


def test_lognormal_tails_and_output_jitter_count_toward_the_context():
    cfg = cpu_run()
    cfg.workload.history_tokens = [1000]
    cfg.workload.output_tokens_jitter = 0.5
    cfg.workload.length_distribution = LengthDistribution.lognormal  # outputs up to 16 x 2.5
    cfg.workload.user_tokens_jitter = 0.5  # users up to 64 x 2.5 = 160: 1000 + 4 x 200
    assert problems_for(cfg, "workload.history_tokens") == []
    cfg.workload.history_tokens = [1300]
    only(cfg, "workload.history_tokens", 1300, "160 user + 40 output", "2100")


def test_the_common_prefix_the_longest_own_prefix_and_the_most_turns_count_toward_the_context():
    cfg = cpu_run()  # 4 turns of 64 user + 16 output tokens
    cfg.workload.history_tokens = [600]
    cfg.workload.common_prefix_tokens = 100
    cfg.workload.history_median_ratio = 0.85  # own prefixes up to 3 x 600 = 1800 tokens
    only(cfg, "workload.history_tokens", 600, "100 common + 1800", "2220")
    cfg.workload.history_tokens_max = 1000  # 100 + 1000 + 6 x 80 = 1580
    cfg.workload.turns_max = 6
    assert problems_for(cfg, "workload.history_tokens") == []
    cfg.workload.turns_max = 12  # 100 + 1000 + 12 x 80 = 2060
    only(cfg, "workload.history_tokens", 600, "12 turns", "2060")


def test_the_seed_benchmarks_settings_are_checked():
    cfg = cpu_run()
    cfg.workload.history_median_ratio = 1.2
    cfg.workload.turns_max = 2  # below turns (4)
    cfg.workload.history_edit_share = 2.0
    only(cfg, "workload.history_median_ratio", 1.2, "(0, 1]", "0.85")
    only(cfg, "workload.turns_max", 2, "below workload.turns (4)")
    only(cfg, "workload.history_edit_share", 2.0, "[0, 1]")


def test_output_jitter_is_checked():
    cfg = cpu_run()
    cfg.workload.output_tokens_jitter = 1.5
    only(cfg, "workload.output_tokens_jitter", 1.5, "[0, 1)", "O x (1 +- 0.5)")


def test_counts_must_be_positive():
    cfg = cpu_run()
    cfg.workload.conversations = [0]
    cfg.workload.history_tokens = [-1]
    cfg.cluster.nodes = 0
    only(cfg, "workload.conversations", 0, "positive")
    only(cfg, "workload.history_tokens", -1, "non-negative")
    only(cfg, "cluster.nodes", 0, "positive")


def test_topology_needs_an_instance():
    cfg = cpu_run()
    cfg.topology = TopologyConfig(name="empty", prefill=RoleSpec(0, 1), decode=RoleSpec(0, 1))
    only(cfg, "topology", "empty", "no instance")


def replace_path(cfg, path):
    cfg.model = replace(cfg.model, path=str(path))
    return cfg


def test_model_path_needed_unless_generated(tmp_path):
    cfg = cpu_run()
    cfg.model = replace(cfg.model, generate=False, path="")
    only(cfg, "model.path", "''", "nothing to serve")
    cfg.model = replace(cfg.model, path=str(tmp_path / "missing"))
    only(cfg, "model.path", tmp_path / "missing", "does not exist")
    only(replace_path(cfg, tmp_path), "model.path", tmp_path, "holds no config.json")
    (tmp_path / "config.json").write_text("{}")
    only(replace_path(cfg, tmp_path), "model.path", tmp_path, "holds no weights")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert problems_for(replace_path(cfg, tmp_path), "model.path") == []
    only(
        replace_path(cfg, tmp_path / "config.json"),
        "model.path",
        tmp_path / "config.json",
        "a file",
    )
    cfg.model = replace(cfg.model, path="meta-llama/Llama-3.1-8B-Instruct")  # a hub id
    assert problems_for(cfg, "model.path") == []
    cfg.model = replace(cfg.model, generate=True, path="/models/x")
    only(cfg, "model.path", "/models/x", "generate is true")


def test_cluster_paths_are_not_checked_from_the_driver():
    cfg = gpu_run()  # slurm executor: /models/... lives on the cluster's filesystem
    assert problems_for(cfg, "model.path") == []


def test_port_ranges_must_not_overlap():
    cfg = cpu_run()
    cfg.server.side_channel_base_port = cfg.server.base_port + 1
    only(cfg, "server.side_channel_base_port", 8101, "overlaps server.base_port range 8100-8101")
    cfg = cpu_run()
    cfg.server.router_port = 5600 + 64  # decode0's side-channel port
    only(cfg, "server.router_port", 5664, "5600-5664")
    cfg = cpu_run()
    cfg.server.base_port = 65535
    only(cfg, "server.base_port", 65535, "outside 1-65535")
    cfg = cpu_run()
    cfg.server.vllm_base_port = 8090  # two instances: vLLM's own ports 8090-8121
    only(cfg, "server.vllm_base_port", 8090, "overlaps server.base_port range 8100-8101")


def test_check_lists_every_problem_one_per_line():
    cfg = gpu_run(p_tp=4, d_tp=6)  # neither TP a multiple of the other
    cfg.model = replace(cfg.model, num_attention_heads=48, num_kv_heads=12, head_dim=128)
    cfg.cluster.gpus_per_node = 16
    cfg.flow.cache_hit_threshold = -0.1
    cfg.workload.turns = 0
    with pytest.raises(ConfigError) as info:
        check(cfg)
    lines = str(info.value).splitlines()
    assert lines[0] == "3 problem(s) in the config:"
    assert lines[1:] == [str(p) for p in info.value.problems]
    fields = {p.field for p in info.value.problems}
    assert fields == {"topology.decode.tp", "flow.cache_hit_threshold", "workload.turns"}
    for line in lines[1:]:
        assert "=" in line and ". Fix: " in line


def test_validate_reads_no_cluster_it_is_not_given(monkeypatch):
    # cpus_per_node 0 on CPU: the driver machine's cores; an explicit value wins, up to the
    # cores a local node (this machine) has
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    cfg = cpu_run()
    cfg.cluster = ClusterConfig(executor=ExecutorKind.local, cpus_per_node=64)
    cfg.server.cpu_threads_per_instance = 16
    assert validate(cfg) == []
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    only(cfg, "cluster.cpus_per_node", 64, "more than this machine's 2 cores")


def test_sweep_axes_and_kv_sampling_are_checked():
    cfg = cpu_run()
    cfg.flow.decoder_kv_blocks_ttl_s = [20, -1]
    only(cfg, "flow.decoder_kv_blocks_ttl_s", -1, "is negative")
    cfg = cpu_run()
    cfg.workload.conversations = [4, 0]
    only(cfg, "workload.conversations", 0, "1 or more")
    cfg = cpu_run()
    cfg.workload.concurrency = []
    only(cfg, "workload.concurrency", [], "has no value")
    cfg = cpu_run()
    cfg.flow.kv_tail = True
    cfg.flow.kv_sample_period_s = 0
    only(cfg, "flow.kv_tail", True, "sampling off")


def test_the_debug_executor_refuses_settings_it_cannot_apply():
    cfg = cpu_run()
    cfg.cluster.executor = ExecutorKind.debug
    cfg.cluster.env = {"FOO": "bar"}
    cfg.cluster.setup = ["module load x"]
    only(cfg, "cluster.env", {"FOO": "bar"}, "runs the job inside this process")
    only(cfg, "cluster.setup", ["module load x"], "Fix: cluster=local")
    cfg.cluster.executor = ExecutorKind.local  # its tasks take both
    assert problems_for(cfg, "cluster.env") == problems_for(cfg, "cluster.setup") == []


def test_a_cluster_model_path_not_seen_here_is_left_to_the_preflight_and_said(tmp_path):
    cfg = gpu_run()
    cfg.model = replace(cfg.model, path="/nowhere/Llama-3.1-8B")
    assert problems_for(cfg, "model.path") == []  # not refused: the nodes may mount it
    (said,) = [str(w) for w in warnings(cfg)]
    assert said.startswith("model.path=/nowhere/Llama-3.1-8B: is not on this machine; each job's")
    cfg.launch.preflight = False
    (said,) = [str(w) for w in warnings(cfg)]
    assert "launch.preflight=false: nothing checks it" in said
    cfg.model = replace(cfg.model, path=str(tmp_path))  # seen here: nothing to say
    assert warnings(cfg) == []
