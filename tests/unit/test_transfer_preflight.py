"""The transfer preflight's pure parts: what it reads between which devices, its floor, the
check's one line, the findings the manifest keeps, and the dry run's words for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connector.bench_config import MemoryKind, XferOp
from connector.layout import KVLayout
from jobs.preflight import runner
from jobs.preflight.checks import check_transfer, transfer_findings
from jobs.preflight.spec import PreflightSpec, spec_from_launch
from jobs.preflight.transfer import agent_name, device_env, roles_on, run_transfer
from pdbench.cli import compose_job
from pdbench.config.schema import Flow, KvBufferDevice, Placement, RoleSpec, TransportConfig
from pdbench.plan.deployments import make_plan
from pdbench.results.manifest import with_nodes
from pdbench.results.preflight import NodeReport
from pdbench.spec.launch import DeploymentSpec, build_launch, describe_preflight
from pdbench.spec.transfer_probe import (
    PROBE_MAX_BYTES,
    PROBE_MIN_BYTES,
    TransferProbe,
    bench_spec,
    floor_gb_s,
    transfer_back_probe,
    transfer_probe,
)
from pdbench.validate.rules import validate
from records.bench import TransferRecord
from tests.unit.helpers import bench_record, cpu_run, gpu_run

pytestmark = pytest.mark.unit

NODE = "node0 (gpu-a01)"


def deployment(cfg):
    return make_plan(cfg).deployments[0]


def nvlink(cfg):
    cfg.transport = TransportConfig(
        name="nvlink",
        kv_buffer_device=KvBufferDevice.cuda,
        ucx_tls="cuda_ipc,cuda_copy,tcp",
        expected_ucx_transports=["cuda_ipc"],
        expected_gb_s=200.0,
    )
    return cfg


def record(gb_s: float, transports: list[str], integrity_ok: bool = True) -> TransferRecord:
    """What connector.bench.runner's reader writes for the probe's one case."""
    return bench_record(
        gb_s=gb_s,
        ucx_transports=transports,
        bytes=512 << 20,
        median_s=(512 << 20) / gb_s / 1e9,
        memcpy_gb_s=1500.0,
        integrity_ok=integrity_ok,
    )


def test_a_cpu_run_reads_dram_between_p_and_d_with_no_floor():
    probe = transfer_probe(deployment(cpu_run()))
    assert (probe.owner, probe.reader, probe.owner_node, probe.reader_node) == (
        "prefill0",
        "decode0",
        0,
        0,
    )
    assert probe.memory == "DRAM" and (probe.owner_gpu, probe.reader_gpu) == (-1, -1)
    assert probe.floor_gb_s == 0 and probe.same_node
    # the tiny model's context is 2 MiB of KV: the read is stretched to PROBE_MIN_BYTES
    assert probe.nbytes == PROBE_MIN_BYTES and probe.tokens % probe.block_size == 0


def test_gpus_read_vram_from_ps_rank_0_by_the_d_rank_that_reads_it():
    probe = transfer_probe(deployment(nvlink(gpu_run(p_tp=1, d_tp=2))))
    assert probe.memory == "VRAM" and probe.split == "1->2"
    # P on GPU 0; D (TP 2) on GPUs 1, 2: its rank 1 reads P rank 0's second half of heads
    assert (probe.owner_gpu, probe.reader_gpu) == (0, 2)
    assert probe.floor_gb_s == pytest.approx(20.0)  # 10% of nvlink's 200 GB/s
    # llama3_8b's 128k context is 16 GiB of KV: the read is capped at PROBE_MAX_BYTES
    assert PROBE_MIN_BYTES <= probe.nbytes <= PROBE_MAX_BYTES


def test_p_and_d_on_two_nodes_read_across_them():
    cfg = gpu_run(placement=Placement.cross_node, nodes=2)
    cfg.transport.expected_gb_s = 25.0
    probe = transfer_probe(deployment(cfg))
    assert (probe.owner_node, probe.reader_node) == (0, 1) and not probe.same_node
    assert (probe.owner_gpu, probe.reader_gpu) == (0, 0)
    assert probe.floor_gb_s == pytest.approx(2.5)
    assert roles_on(probe, 0) == ["owner"] and roles_on(probe, 1) == ["reader"]
    assert roles_on(transfer_probe(deployment(cpu_run())), 0) == ["owner", "reader"]


def test_no_p_d_pair_no_probe():
    cfg = cpu_run()
    cfg.topology.prefill, cfg.topology.decode = RoleSpec(0, 1), RoleSpec(0, 1)
    cfg.topology.agg = RoleSpec(1, 1)
    assert transfer_probe(deployment(cfg)) is None
    skipped = check_transfer(None, None)
    assert skipped.ok and skipped.skipped


@pytest.mark.parametrize(
    ("share", "expected", "floor"), [(0.1, 25.0, 2.5), (0.1, 0.0, 0.0), (0.0, 200.0, 0.0)]
)
def test_the_floor_is_a_share_of_what_the_fabric_should_give(share, expected, floor):
    transport = TransportConfig(expected_gb_s=expected, preflight_floor_share=share)
    assert floor_gb_s(transport) == pytest.approx(floor)


def test_the_probe_is_one_kv_shaped_read_of_the_transfer_bench():
    probe = transfer_probe(deployment(nvlink(gpu_run(p_tp=1, d_tp=2))))
    spec = bench_spec(probe)
    (case,) = spec.cases
    assert (case.op, case.layout, str(case.split), case.tokens) == (
        XferOp.READ,
        KVLayout.HND,
        "1->2",
        probe.tokens,
    )
    assert spec.memory is MemoryKind.VRAM and spec.expected_gb_s == 200.0
    assert spec.transfer(case, case.timed_d_rank).nbytes == probe.nbytes


def test_under_the_floor_over_a_tcp_fallback_fails_in_one_line_with_the_fix():
    probe = transfer_probe(deployment(nvlink(gpu_run())))
    found = transfer_findings(probe, record(1.1, ["tcp/eth0"]))
    result = check_transfer(probe, found)
    line = result.line(NODE)
    assert not result.ok and "\n" not in line
    assert line.startswith(f"preflight {NODE} transfer: found 1.10 GB/s over tcp/eth0,")
    assert "prefill0 (node0 GPU 0) to decode0 (node0 GPU 1)" in line
    assert "under the floor 20 GB/s (10% of transport.expected_gb_s=200)" in line
    assert "over tcp/eth0, not the expected cuda_ipc (512 MiB" in line
    assert ". Fix: UCX fell back to tcp/eth0" in line and "preflight_floor_share=0" in line


def test_at_or_over_the_floor_passes_and_names_the_transport():
    probe = transfer_probe(deployment(nvlink(gpu_run())))
    result = check_transfer(probe, transfer_findings(probe, record(180.0, ["cuda_ipc/cuda"])))
    assert result.ok and result.found.startswith("180.00 GB/s over cuda_ipc/cuda ")


def test_with_no_floor_a_slow_read_passes_and_is_recorded():
    probe = transfer_probe(deployment(cpu_run()))
    found = transfer_findings(probe, record(0.5, ["tcp/lo"]))
    assert check_transfer(probe, found).ok
    assert found["gb_s"] == 0.5 and found["ucx_transports"] == ["tcp/lo"]


def test_a_read_that_failed_or_moved_wrong_bytes_fails():
    probe = transfer_probe(deployment(nvlink(gpu_run())))
    failed = transfer_findings(probe, bench_record(status="failed", error="PeerAborted: x\ntrace"))
    line = check_transfer(probe, failed).line(NODE)
    assert "no KV-shaped NIXL read from prefill0" in line and "PeerAborted: x" in line
    assert "trace" not in line and "Fix: a UCX_TLS" in line
    wrong = transfer_findings(probe, record(150.0, ["cuda_ipc/cuda"], integrity_ok=False))
    assert "moved other bytes" in check_transfer(probe, wrong).line(NODE)


def test_the_owner_side_alone_is_skipped_not_judged():
    probe = transfer_probe(deployment(gpu_run(placement=Placement.cross_node, nodes=2)))
    result = check_transfer(probe, None)
    assert result.ok and result.skipped and "node1" in result.found


def test_the_figure_reaches_the_manifests_nodes():
    probe = transfer_probe(deployment(cpu_run()))
    found = transfer_findings(probe, record(2.5, ["cma/memory"]))
    report = {"rank": 0, "node_name": "vm", "ok": True, "findings": {"transfer": found}}
    nodes = with_nodes({}, [report], "dep")["nodes"]
    assert nodes["vm"]["transfer"]["gb_s"] == 2.5
    assert nodes["vm"]["transfer"]["ucx_transports"] == ["cma/memory"]
    assert json.loads(json.dumps(nodes))  # JSON as the manifest keeps it


def test_the_dry_run_names_the_transfer_preflight():
    cfg = nvlink(gpu_run())
    dep = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    line = describe_preflight(dep)
    assert "transfer preflight: one " in line and "MiB KV read" in line
    assert "by decode0 (node0 GPU 1) from prefill0 (node0 GPU 0)" in line
    assert "fails under 20 GB/s" in line
    cpu = cpu_run()
    cpu_line = describe_preflight(build_launch(cpu, make_plan(cpu), "/m").deployments[0])
    assert "(node0 DRAM)" in cpu_line and cpu_line.endswith("no floor")


def test_the_probe_travels_in_the_launch_and_preflight_specs():
    cfg = nvlink(gpu_run(p_tp=1, d_tp=2))
    dep = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert DeploymentSpec.from_dict(json.loads(json.dumps(dep.to_dict()))) == dep
    spec = spec_from_launch(dep)
    assert spec.transfer == dep.transfer
    assert PreflightSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert TransferProbe.from_dict(dep.transfer.to_dict()) == dep.transfer


def test_each_side_sees_its_own_gpu_through_the_tasks_devices():
    probe = transfer_probe(deployment(nvlink(gpu_run())))
    assert device_env(probe, "owner", "4,5,6,7") == {"CUDA_VISIBLE_DEVICES": "4"}
    assert device_env(probe, "reader", "4,5,6,7") == {"CUDA_VISIBLE_DEVICES": "5"}
    assert device_env(probe, "reader", None) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert device_env(transfer_probe(deployment(cpu_run())), "reader", None) == {}


def test_a_node_whose_checks_failed_tells_its_peer_instead_of_reading(tmp_path: Path):
    probe = transfer_probe(deployment(gpu_run(placement=Placement.cross_node, nodes=2)))
    result = run_transfer(probe, 1, tmp_path, "python", {}, healthy=False)
    assert result == (None, None)
    told = list((tmp_path / "rendezvous").rglob(f"*{agent_name('reader')}*"))
    assert told, "the owner's process would wait out its timeout"


def test_a_side_that_cannot_start_fails_the_check_in_one_line(tmp_path: Path):
    probe = transfer_probe(deployment(cpu_run()))
    result, found = run_transfer(probe, 0, tmp_path, "/nowhere/python", {})
    line = result.line(NODE)
    assert not result.ok and "\n" not in line
    assert "owner side: /nowhere/python did not start" in found["error"]
    assert line.startswith(f"preflight {NODE} transfer: found no KV-shaped NIXL read from prefill0")


@pytest.mark.parametrize(
    ("override", "start"),
    [
        (
            "transport.preflight_floor_share=1.5",
            "transport.preflight_floor_share=1.5: is the share",
        ),
        ("cluster.gpu_tflops=-1", "cluster.gpu_tflops=-1.0: is negative"),
    ],
)
def test_a_floor_share_outside_0_1_or_negative_tflops_are_refused(override, start):
    (line,) = [str(p) for p in validate(compose_job(["+experiment=smoke", override]))]
    assert line.startswith(start) and ". Fix: " in line


def test_a_deployment_that_pulls_on_gpus_is_read_both_ways():
    """A pull is P reading D's blocks: on GPUs that path is checked too (GPUDirect RDMA and
    NVLink P2P may work one way only), the same bytes per read, the roles swapped."""
    cfg = nvlink(gpu_run(p_tp=1, d_tp=2))
    dep = deployment(cfg)
    forward, back = transfer_probe(dep), transfer_back_probe(dep)
    assert dep.bidirectional and back is not None
    assert (back.owner, back.reader) == (forward.reader, forward.owner)
    assert (back.owner_gpu, back.reader_gpu) == (forward.reader_gpu, forward.owner_gpu)
    assert back.nbytes == forward.nbytes and back.split == "1->1"
    launch = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert DeploymentSpec.from_dict(json.loads(json.dumps(launch.to_dict()))) == launch
    assert spec_from_launch(launch).transfer_back == back
    assert "then the other way: one " in describe_preflight(launch)


def test_one_read_where_the_two_ways_are_one_path_or_nothing_pulls():
    cpu = cpu_run()
    assert transfer_probe(deployment(cpu)) is not None
    assert transfer_back_probe(deployment(cpu)) is None  # host memory: one path
    cfg = nvlink(gpu_run())
    cfg.flow.flows = [Flow.recompute]  # P never reads D's blocks
    assert transfer_back_probe(deployment(cfg)) is None


def test_the_preflight_runs_the_reads_in_order_each_its_own_check(tmp_path, monkeypatch):
    cfg = nvlink(gpu_run())
    spec = spec_from_launch(build_launch(cfg, make_plan(cfg), "/m").deployments[0])
    ran = []

    def read(probe, rank, work, python, env, healthy):
        ran.append((probe.reader, work.name))
        return check_transfer(probe, None), {"reader": probe.reader}

    monkeypatch.setattr(runner, "run_transfer", read)
    report = NodeReport(rank=0, node_name="node0", hostname="gpu-a01")
    runner.transfer_check(spec, 0, tmp_path, {}, report)
    assert ran == [("decode0", "transfer"), ("prefill0", "transfer_back")]
    assert [r.check for r in report.results] == ["transfer", "transfer back"]
    assert set(report.findings) == {"transfer", "transfer_back"}
