import json

import pytest

from connector.plugin.engine_idle import CPU_WAIT_MS
from connector.plugin.nixl_progress import CPU_DELAY_US
from pdbench.config.schema import Flow, RoleSpec
from pdbench.plan.deployments import make_plan
from pdbench.spec.serve_command import kv_transfer_config, serve_command, serve_env
from tests.unit.helpers import cpu_run, gpu_run

pytestmark = pytest.mark.unit


def _flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_cpu_prefill_command_and_env():
    dep = make_plan(cpu_run()).deployments[0]
    p, d = dep.instances
    cmd = serve_command(dep, p, "/m", "127.0.0.1", "python")
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--port") == str(p.http_port) and _flag(cmd, "--host") == "127.0.0.1"
    assert _flag(cmd, "--block-size") == "32"
    assert "--no-enable-prefix-caching" in cmd  # P off by default
    assert "--enable-prefix-caching" in serve_command(dep, d, "/m", "127.0.0.1", "python")
    kv = json.loads(_flag(cmd, "--kv-transfer-config"))
    assert kv["kv_connector"] == "NixlConnector"
    assert kv["kv_connector_module_path"] == "connector.plugin.vllm_plugin"
    assert kv["kv_buffer_device"] == "cpu"
    assert kv["kv_connector_extra_config"]["bidirectional_kv_xfer"] is True
    env = serve_env(dep, p, "127.0.0.1", "", "/tr")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    d_env = serve_env(dep, d, "127.0.0.1", "127.0.0.1:5727", "/tr")
    assert d_env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(p.side_channel_port)
    assert d_env["PDBENCH_KV_PARAMS_ADDR"] == "127.0.0.1:5727"
    assert "PDBENCH_KV_PARAMS_ADDR" not in env  # P's params come in its own response
    assert "CUDA_VISIBLE_DEVICES" not in env
    # What the servers run with is in the spec: the engine core forked, not spawned
    # (connector/plugin/engine_start.py), TP 1 workers inside the engine core, the NIXL progress
    # thread's poll timeout (connector/plugin/nixl_progress.py), the engine's wait while it only
    # holds leases (connector/plugin/engine_idle.py).
    for e in (env, d_env):
        assert e["PDBENCH_ENGINE_START"] == "fork"
        assert e["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        assert e["PDBENCH_NIXL_PROGRESS_DELAY_US"] == str(CPU_DELAY_US)
        assert e["PDBENCH_ENGINE_IDLE_WAIT_MS"] == str(CPU_WAIT_MS)


def test_cpu_overrides_of_the_process_choices_win():
    cfg = cpu_run()
    cfg.server.env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        "PDBENCH_NIXL_PROGRESS_DELAY_US": "0",
        "PDBENCH_ENGINE_IDLE_WAIT_MS": "0",
        "PDBENCH_ENGINE_START": "spawn",
    }
    dep = make_plan(cfg).deployments[0]
    env = serve_env(dep, dep.instances[0], "h", "", "/tr")
    assert env["PDBENCH_ENGINE_START"] == "spawn"
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert env["PDBENCH_NIXL_PROGRESS_DELAY_US"] == "0"
    assert env["PDBENCH_ENGINE_IDLE_WAIT_MS"] == "0"


def test_an_agg_instance_has_no_nixl_agent_to_tune():
    cfg = cpu_run()
    cfg.topology.prefill, cfg.topology.decode = RoleSpec(0, 1), RoleSpec(0, 1)
    cfg.topology.agg = RoleSpec(1, 1)
    cfg.flow.flows = [Flow.agg]
    dep = make_plan(cfg).deployments[0]
    (agg,) = dep.instances
    env = serve_env(dep, agg, "h", "", "/tr")
    assert "PDBENCH_NIXL_PROGRESS_DELAY_US" not in env
    assert "PDBENCH_ENGINE_IDLE_WAIT_MS" not in env  # no connector: vLLM holds no lease
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["PDBENCH_ENGINE_START"] == "fork"  # every CPU server forks its engine core


def test_cpu_tp2_binds_each_rank_and_threads_per_rank():
    cfg = cpu_run()
    cfg.cluster.cpus_per_node = 6
    cfg.server.cpu_threads_per_instance = 2
    cfg.topology.decode.tp = 2
    dep = make_plan(cfg).deployments[0]
    p, d = dep.instances
    env = serve_env(dep, d, "127.0.0.1", "/kv", "/tr")
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3|4,5"  # vLLM splits ranks on '|'
    assert env["OMP_NUM_THREADS"] == "2"  # per rank
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(d.side_channel_port)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env  # TP 2: a worker process per rank
    assert env["PDBENCH_ENGINE_START"] == "fork"
    assert _flag(serve_command(dep, d, "/m", "h", "python"), "--tensor-parallel-size") == "2"
    assert serve_env(dep, p, "h", "/kv", "/tr")["VLLM_CPU_OMP_THREADS_BIND"] == "0,1"


def test_kv_blocks_go_to_their_role_only():
    cfg = cpu_run()
    cfg.server.prefill_kv_blocks = 128
    dep = make_plan(cfg).deployments[0]
    p, d = dep.instances
    assert _flag(serve_command(dep, p, "/m", "h", "python"), "--num-gpu-blocks-override") == "128"
    assert "--num-gpu-blocks-override" not in serve_command(dep, d, "/m", "h", "python")
    cfg.server.decode_kv_blocks = 256
    dep = make_plan(cfg).deployments[0]
    d = dep.instances[1]
    assert _flag(serve_command(dep, d, "/m", "h", "python"), "--num-gpu-blocks-override") == "256"


def test_recompute_only_does_not_enable_bidirectional():
    cfg = cpu_run()
    cfg.flow.flows = [Flow.recompute]
    kv = kv_transfer_config(make_plan(cfg).deployments[0])
    assert "bidirectional_kv_xfer" not in kv["kv_connector_extra_config"]
    assert kv["kv_connector_extra_config"]["kv_recompute_threshold"] == 64


def test_the_kv_load_failure_policy_reaches_the_kv_transfer_config():
    # Which one is the default per cluster kind: tests/unit/test_gpu_defaults.py.
    cfg = cpu_run()
    for policy in ("recompute", "fail"):
        cfg.server.kv_load_failure_policy = policy
        kv = kv_transfer_config(make_plan(cfg).deployments[0])
        assert kv["kv_load_failure_policy"] == policy


def test_gpu_rdma_heterogeneous_tp():
    dep = make_plan(gpu_run(p_tp=2, d_tp=4)).deployments[0]
    p, d = dep.instances
    cmd = serve_command(dep, d, "/models/llama", "10.0.0.5", "python")
    assert _flag(cmd, "--tensor-parallel-size") == "4"
    assert "--gpu-memory-utilization" in cmd
    env = serve_env(dep, d, "10.0.0.5", "/kv", "/tr")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3,4,5"
    assert env["UCX_TLS"] == "rc,cuda_copy"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5"
    assert json.loads(_flag(cmd, "--kv-transfer-config"))["kv_buffer_device"] == "cuda"
    for inst in (p, d):  # GPUs: vLLM's own process layout and NIXL's own progress loop
        env = serve_env(dep, inst, "10.0.0.5", "/kv", "/tr")
        assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
        assert "PDBENCH_ENGINE_START" not in env  # vLLM forks unless CUDA says spawn
        assert "PDBENCH_NIXL_PROGRESS_DELAY_US" not in env


def test_each_instance_gets_its_own_vllm_port_range():
    # Two TP 4 servers starting at once on one node: without VLLM_PORT each takes a free
    # port for its torch distributed init and releases it before binding, and both can
    # draw the same one. Each instance's range starts 16 ports after the previous one.
    dep = make_plan(gpu_run(p_tp=4, d_tp=4)).deployments[0]
    p, d = dep.instances
    ports = [int(serve_env(dep, i, "h", "", "/tr")["VLLM_PORT"]) for i in (p, d)]
    assert ports == [19000, 19016]
    assert p.node == d.node
