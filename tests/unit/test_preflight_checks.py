"""The preflight's pure checks and its spec: one line per failure (node, check, found, fix)."""

from __future__ import annotations

import sys

import pytest

from connector.ucx import parse_ucp_context_info, parse_ucx_info_devices
from jobs.preflight.checks import (
    ImportFacts,
    ModelFacts,
    UcxFacts,
    check_build_tools,
    check_gpus,
    check_imports,
    check_memlock,
    check_model,
    check_nvlink,
    check_ports,
    check_ucx,
    physical_pairs,
)
from jobs.preflight.nvidia_smi import parse_gpu_query, parse_topology
from jobs.preflight.probes import import_facts, port_holders
from jobs.preflight.spec import NodeExpectation, PreflightSpec, spec_from_config, spec_from_launch
from pdbench.config.schema import Placement
from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import build_launch
from tests.unit.fixture_text import fixture
from tests.unit.helpers import cpu_run, gpu_run

pytestmark = pytest.mark.unit

H100 = parse_gpu_query(fixture("nvidia_smi_query_h100_written.csv"))
NODE = "node0 (gpu-a01)"


def one_line(result) -> str:
    assert not result.ok
    line = result.line(NODE)
    assert "\n" not in line and line.startswith(f"preflight {NODE} {result.check}: found ")
    assert ". Fix: " in line
    return line


def test_spec_of_a_cpu_run_expects_no_gpus():
    spec = spec_from_config(cpu_run(), "/models/tiny")
    assert [n.gpus for n in spec.nodes] == [()]
    assert spec.gpu_memory_gib == 0 and spec.model_path == "/models/tiny"
    assert PreflightSpec.from_dict(spec.to_dict()) == spec


def test_spec_of_nvlink_pairs_follows_the_tp_fan_out():
    cfg = gpu_run(p_tp=2, d_tp=4)
    cfg.transport.expected_ucx_transports = ["cuda_ipc"]
    cfg.transport.ucx_tls = "cuda_ipc,cuda_copy,tcp"
    spec = spec_from_config(cfg, "/m")
    (node,) = spec.nodes
    assert node.gpus == (0, 1, 2, 3, 4, 5)
    # D ranks 0..3 on GPUs 2..5 read from P ranks 0,0,1,1 on GPUs 0,1.
    assert node.nvlink_pairs == ((2, 0), (3, 0), (4, 1), (5, 1))
    assert spec.server_env["UCX_TLS"] == "cuda_ipc,cuda_copy,tcp"


def test_spec_of_a_cross_node_rdma_run():
    cfg = gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    cfg.transport.expected_ucx_transports = ["rc"]
    spec = spec_from_config(cfg, "/m")
    assert [(n.node, n.gpus, n.nvlink_pairs) for n in spec.nodes] == [
        (0, (0, 1), ()),
        (1, (0, 1), ()),
    ]


def test_imports():
    assert check_imports(ImportFacts({"vllm": "0.32.0", "nixl": "1.5.1"}), "python").ok
    line = one_line(check_imports(ImportFacts(errors={"vllm": "ModuleNotFoundError: x"}), "py"))
    assert "import vllm fails" in line and "make install-gpu" in line
    assert "could not run" in one_line(check_imports(ImportFacts(error="No such file"), "/x/py"))


def test_gpus_against_the_plan():
    expect = NodeExpectation(0, (0, 1, 2, 3))
    assert check_gpus(expect, H100, None, 79.6).ok
    assert check_gpus(NodeExpectation(0, ()), None, None, 0).skipped
    assert "no nvidia-smi" in one_line(check_gpus(expect, None, None, 0))
    assert "1 GPU(s)" in one_line(check_gpus(expect, H100[:1], None, 0))
    small = one_line(check_gpus(expect, H100, None, 141.0))
    assert "has 79.6 GiB, less than cluster.gpu_memory_gib=141.0" in small
    # A node shared with other jobs: the plan's GPUs 0-3 are this task's devices 4-7.
    shared = check_gpus(expect, H100, "4,5,6,7", 0)
    assert shared.ok and "(devices 4,5,6,7 of this task)" in shared.found
    assert check_gpus(expect, H100[:4], "0,1,2,3", 0).ok  # cgroup-constrained: fine
    few = one_line(check_gpus(expect, H100, "6,7", 0))
    assert "CUDA_VISIBLE_DEVICES=6,7 (2) but the plan uses GPUs [0, 1, 2, 3]" in few
    gone = one_line(check_gpus(NodeExpectation(0, (0, 1)), H100[:4], "5,6", 0))
    assert "are devices 5,6 of this task, but nvidia-smi lists GPU(s) 0, 1, 2, 3" in gone


def test_nvlink_pairs_map_through_the_tasks_devices():
    expect = NodeExpectation(0, (0, 1), ((1, 0),))
    assert physical_pairs(expect, None) == ((1, 0),)
    assert physical_pairs(expect, "4,6") == ((6, 4),)
    uuids = "GPU-a,GPU-b"  # not indices: left to the plan's
    assert physical_pairs(expect, uuids) == ((1, 0),)


def test_nvlink_pairs_against_the_topology():
    h100 = parse_topology(fixture("nvidia_smi_topo_h100_8gpu_written.txt"))
    pcie = parse_topology(fixture("nvidia_smi_topo_pcie_4gpu_written.txt"))
    expect = NodeExpectation(0, (0, 1, 2, 3), ((1, 0), (3, 2)))
    result = check_nvlink(expect, h100)
    assert result.ok and "2 P/D GPU pair(s) over NV18" in result.found
    line = one_line(check_nvlink(expect, pcie))
    assert "GPU1 (decode) and GPU0 (prefill) are linked by PIX, not NVLink" in line
    assert "(and 1 more pair(s))" in line and "transport=tcp or rdma" in line
    assert check_nvlink(NodeExpectation(0, (0, 1)), None).skipped


def test_ucx_expected_transport_on_a_gpu_node():
    resources = parse_ucx_info_devices(fixture("ucx_info_d_h100_ib_written.txt"))
    facts = UcxFacts(resources, "system ucx_info 1.17.0")
    ok = check_ucx(("rc",), "rc,cuda_copy,cuda_ipc", facts)
    assert ok.ok and "rc_mlx5/mlx5_0:1" in ok.found


def test_ucx_expected_transport_missing_is_one_line():
    # This VM's bundled UCX: no HCA, no CUDA.
    cpu = UcxFacts(
        parse_ucp_context_info(fixture("ucp_context_nixl_1.23.0_cpu.txt")), "NIXL's UCX 1.23.0"
    )
    assert check_ucx(("sm", "tcp"), "", cpu).ok
    line = one_line(check_ucx(("rc",), "rc,cuda_copy,cuda_ipc", cpu))
    assert "NIXL's UCX 1.23.0 with UCX_TLS=rc,cuda_copy,cuda_ipc lists" in line
    assert "none of the expected rc_mlx5, rc_verbs" in line
    opened = one_line(
        check_ucx(
            ("cuda_ipc",),
            "cuda_ipc,cuda_copy",
            UcxFacts(source="NIXL's UCX", error="no usable transports"),
        )
    )
    assert "opens no context" in opened


def test_ucx_without_a_connectable_transport():
    shm_only = UcxFacts(
        parse_ucp_context_info("#  resource 0 : md 0 dev 0 flags -- posix/memory"), "u"
    )
    assert "NIXL cannot connect" in one_line(check_ucx((), "sm", shm_only))


def test_model_facts():
    ok = check_model("/m", ModelFacts("dir", "/m", detail="4 weight file(s), 15.0 GiB"))
    assert ok.ok
    line = one_line(check_model("/m", ModelFacts("dir", "/m", "no such directory on this node")))
    assert "/m: no such directory on this node" in line and "model.path=" in line
    hub = ModelFacts("hub", "/h", "not in the hub cache /h (~/.cache)", offline=False)
    assert check_model("org/x", hub).skipped
    hub.offline = True
    assert "HF_HOME" in one_line(check_model("org/x", hub))


def test_node_findings_go_into_the_provenance():
    from pdbench.results.manifest import with_nodes

    reports = [
        {"rank": 0, "node_name": "gpu-a01", "hostname": "gpu-a01.cluster", "ok": True,
         "findings": {"driver": "550.54.15", "cuda": "12.4", "packages": {"vllm": "0.32.0"}}},
        {"rank": 1, "node_name": "gpu-a02", "hostname": "gpu-a02.cluster", "ok": False,
         "findings": {"driver": "535.86.10"}},
    ]  # fmt: skip
    prov = with_nodes({"git_sha": "abc"}, reports)
    assert prov["git_sha"] == "abc"
    assert prov["nodes"]["gpu-a01"]["driver"] == "550.54.15"
    assert prov["nodes"]["gpu-a01"]["hostname"] == "gpu-a01.cluster"
    assert prov["nodes"]["gpu-a02"]["preflight_ok"] is False


def test_address_failures_carry_their_fix():
    from jobs.preflight.checks import check_address

    assert check_address("10.1.0.7", "gpu7 resolves to it", "").ok
    line = one_line(
        check_address("", "", "node gpu7 resolves to 127.0.1.1, a loopback address. Fix: map gpu7")
    )
    assert line.endswith("found node gpu7 resolves to 127.0.1.1, a loopback address. Fix: map gpu7")
    unresolved = one_line(check_address("", "", "cannot resolve SLURM node 'gpu7'"))
    assert "Fix: map this node's name in /etc/hosts or DNS" in unresolved


def test_each_node_expects_the_ports_its_servers_and_router_listen_on():
    cfg = gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    dep = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    spec = spec_from_launch(dep)
    for node in spec.nodes:
        mine = dep.on_node(node.node)
        wanted = {i.http_port for i in mine} | {i.side_channel_port for i in mine}
        wanted |= {i.kv_params_port for i in mine if i.kv_params_port}
        wanted |= {dep.router.port} if dep.router.node == node.node else set()
        assert set(node.ports) == wanted and node.ports == tuple(sorted(wanted))
    assert dep.router.port in spec.nodes[0].ports
    assert PreflightSpec.from_dict(spec.to_dict()) == spec


def test_a_planned_port_another_process_holds_is_named_with_its_holder():
    assert check_ports((), {}).skipped
    free = check_ports((8000, 8100), {9999: "pid 1 (x)"})
    assert free.ok and free.found == "free: 8000, 8100"
    line = one_line(check_ports((8000, 8100), {8100: "pid 77 (python -m vllm... --port 8100)"}))
    assert "found port 8100 is held by pid 77 (python -m vllm... --port 8100)" in line
    assert "server.base_port" in line


def test_port_holders_finds_this_process_listening():
    import os
    import socket

    import psutil

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        (who,) = port_holders([port]).values()
        command = " ".join(psutil.Process().cmdline())[:200]  # pytest-xdist retitles it
        assert who == f"pid {os.getpid()} ({command})"
    assert port_holders([port]) == {}  # closed: free again


def test_gpu_servers_that_compile_need_a_compiler_and_python_h():
    """vLLM builds Triton's CUDA driver stub at its first start unless --enforce-eager."""
    spec = spec_from_config(gpu_run(), "/m")
    assert spec.compiles and not spec_from_config(cpu_run(), "/m").compiles
    eager = gpu_run()
    eager.server.enforce_eager = True
    assert not spec_from_config(eager, "/m").compiles
    ready = {"c_compiler": "/usr/bin/gcc", "python_h": True}
    assert check_build_tools(True, ready).ok and check_build_tools(False, {}).skipped
    line = one_line(check_build_tools(True, {"c_compiler": "", "python_h": True}))
    assert "a C compiler" in line and "Triton" in line and "server.enforce_eager=true" in line
    assert "Python.h" in one_line(check_build_tools(True, {"c_compiler": "/gcc"}))


def test_rdma_needs_memory_it_can_lock():
    cfg = gpu_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    cfg.transport.expected_ucx_transports = ["rc"]
    assert spec_from_config(cfg, "/m").registers_memory
    assert not spec_from_config(gpu_run(), "/m").registers_memory
    assert check_memlock(True, {"memlock_bytes": -1}).ok  # unlimited
    line = one_line(check_memlock(True, {"memlock_bytes": 64 << 10}))
    assert "limited to 64 KiB" in line and "memlock unlimited" in line
    assert check_memlock(False, {"memlock_bytes": 0}).skipped


def test_the_import_probe_reports_the_build_tools_and_the_lock_limit_here():
    _, extra = import_facts(sys.executable, (), {})
    assert isinstance(extra["python_h"], bool) and "memlock_bytes" in extra
    assert extra["c_compiler"].endswith(("gcc", "cc")) or extra["c_compiler"] == ""
