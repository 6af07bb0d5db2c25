"""P/D on the real local two-node SLURM cluster: P on node1, D on node2.

One cross-node run (its dry run printed first, for the same config and run dir) is shared by
the tests that read what happened inside it: the P/D pipeline across nodes, and the job
having run the spec the dry run printed with each node's own address.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdbench.spec.launch import (
    DeploymentSpec,
    describe_deployment,
    node_address_placeholder,
    resolve,
)
from tests.e2e.conftest import load_points, outputs_by_turn, run_pdbench, server_pids
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


@pytest.fixture(scope="module")
def cross_node_run(local_slurm, tmp_path_factory):  # noqa: F811
    """The dry run, then the real run, of one P/D Deployment across the two SLURM nodes."""
    run_dir = tmp_path_factory.mktemp("cross_node") / "run"
    args = [*CROSS, "workload.conversations=2", f"dir={run_dir}"]
    dry = run_pdbench([*args, "launch.dry_run=true"], timeout_s=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not (run_dir / "points").exists()  # a dry run measures nothing
    real = run_pdbench(args, 1500)
    assert real.returncode == 0, real.stdout[-4000:] + real.stderr[-2000:]
    return run_dir, dry, real


def test_cross_node_pd_on_two_slurm_nodes(cross_node_run):
    run_dir, _, proc = cross_node_run
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


def test_on_slurm_the_job_ran_the_dry_runs_spec_with_the_nodes_addresses(cross_node_run):
    """What the dry run prints is what the job runs, on SLURM too: the dry run printed a
    placeholder where each node's address goes, the job resolved every one of them."""
    run_dir, dry, _ = cross_node_run
    points = load_points(run_dir)
    assert {p["launch_spec_file"] for p in points.values()} == {points["pull"]["launch_spec_file"]}
    ran = DeploymentSpec.from_dict(
        json.loads((run_dir / points["pull"]["launch_spec_file"]).read_text())
    )
    assert ran.nodes == 2 and ran.placeholders() == []
    addresses = {i.node: i.host for i in ran.instances}
    assert addresses[0] != addresses[1]  # each node's own address, not loopback for both
    # The job's spec with its addresses put back as placeholders renders line for line as
    # the dry run printed it.
    text = json.dumps(ran.to_dict())
    for node, address in addresses.items():
        text = text.replace(address, node_address_placeholder(node))
    unresolved = DeploymentSpec.from_dict(json.loads(text))
    assert resolve(unresolved, addresses) == ran
    block = "\n".join(describe_deployment(unresolved))
    assert block in dry.stdout, f"job's spec:\n{block}\n\ndry run:\n{dry.stdout}"
    # And the sbatch file SLURM got is the one the dry run printed.
    (submitted,) = (run_dir / "submitit").glob("*_submission.sh")
    printed = dry.stdout.split("  sbatch script:\n", 1)[1]
    assert "\n".join("    " + line for line in submitted.read_text().splitlines()) in printed
    for inst in ran.instances:  # the servers really ran: their logs are where the spec says
        assert Path(inst.log_path).is_file(), inst.log_path
