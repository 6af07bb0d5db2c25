"""P/D on the real local two-node SLURM cluster: P on node1, D on node2, then scancel + resume."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.e2e.conftest import load_points, outputs_by_turn, run_pdbench, server_pids
from tests.e2e.test_faults import start_pdbench
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

CROSS = [
    "+experiment=smoke",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "cluster=slurm",
    "topology.placement=cross_node",
    "workload.concurrency=2",  # the tests run 2 conversations
]


def test_cross_node_pd_on_two_slurm_nodes(local_slurm, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    proc = run_pdbench([*CROSS, "workload.conversations=2", f"dir={run_dir}"], 1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    points = load_points(run_dir)
    assert set(points) == {"agg", "recompute", "pull"}
    hosts = points["pull"]["hosts"]
    assert "127.0.10.1" in hosts["prefill0"] and "127.0.10.2" in hosts["decode0"], hosts
    instances = {i["name"]: i["node"] for i in points["pull"]["deployment"]["instances"]}
    assert instances == {"prefill0": 0, "decode0": 1}
    agg = outputs_by_turn(run_dir, points["agg"])
    for flow in ("recompute", "pull"):
        assert points[flow]["status"] == "ok"
        assert outputs_by_turn(run_dir, points[flow]) == agg, flow
    turn2 = next(r for r in points["pull"]["by_turn"] if r["turn"] == 2)
    assert turn2["bytes_pulled"] > 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["jobs"] and manifest["jobs"][0]["job_id"].isdigit()  # a SLURM job id
    # The job's first step: the preflight on both nodes, findings in the provenance.
    nodes = manifest["provenance"]["nodes"]
    assert sorted(nodes) == ["node1", "node2"]
    for node in nodes.values():
        assert node["preflight_ok"] and node["packages"]["nixl"] and node["gpus"] == []
        assert node["address"]["address"].startswith("127.0.10.")
    assert "preflight node1 (node2) reach: found 1 other node(s) answer" in proc.stdout
    assert server_pids(run_dir) == []


def test_scancel_mid_sweep_then_resume_records_every_point_once(local_slurm, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    args = [*CROSS, "workload.conversations=2", "workload.turns=2", f"dir={run_dir}"]
    proc = start_pdbench(args)
    deadline = time.monotonic() + 900
    while not list((run_dir / "points").glob("*.json")):
        assert time.monotonic() < deadline and proc.poll() is None, "no point recorded"
        time.sleep(1)
    job_id = json.loads((run_dir / "manifest.json").read_text())["jobs"][0]["job_id"]
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    proc.communicate(timeout=600)
    assert proc.returncode != 0
    again = run_pdbench(args, 1500)
    assert again.returncode == 0, again.stdout[-4000:]
    points = list((run_dir / "points").glob("*.json"))
    assert len(points) == 3
    records = [json.loads(p.read_text()) for p in points]
    assert {r["status"] for r in records} == {"ok"}
    assert len({r["point_id"] for r in records}) == 3
    for r in records:  # one request record per (conversation, turn): none doubled
        lines = (run_dir / r["requests_file"]).read_text().splitlines()
        assert len(lines) == r["workload"]["conversations"] * r["workload"]["turns"]
    assert server_pids(run_dir) == []
