"""A Hydra -m sweep on the local SLURM cluster submits every Deployment before following
any: the scheduler may run them side by side, and ``status`` shows the whole sweep."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import run_pdbench, server_pids
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

# One agg server per job (one node each), two Deployments: the sweep's two compositions.
SWEEP = [
    "-m",
    "+experiment=smoke",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "cluster=slurm",
    "topology=agg",
    "flow=agg",
    "workload.conversations=1",
    "workload.concurrency=1",
    "workload.turns=2",
    "server.max_num_seqs=4,8",
]


def test_a_sweep_submits_every_job_before_following_them(local_slurm, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    proc = run_pdbench([*SWEEP, f"dir={run_dir}"], timeout_s=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    out = proc.stdout
    submitted = [line for line in out.splitlines() if line.startswith("[pdbench] submitted ")]
    assert len(submitted) == 2, out[-3000:]
    # Both submitted before the first line any job printed was followed.
    assert out.index(submitted[1]) < out.index(" | job "), out[-3000:]
    assert "[pdbench] sweep: 2 job(s) of 2 composition(s) submitted" in out

    manifest = json.loads((run_dir / "manifest.json").read_text())
    jobs = manifest["jobs"]
    assert len(jobs) == 2 and all(j["job_id"].isdigit() for j in jobs)
    points = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    assert len(points) == 2 and {p["status"] for p in points} == {"ok"}
    ends = {}
    for p in points:
        dep = p["deployment"]["deployment_id"]
        ends[dep] = max(ends.get(dep, 0.0), p["finished_at"])
    # The second job went to SLURM before the first job's last Point was measured.
    assert max(j["submitted_at"] for j in jobs) < min(ends.values())
    assert server_pids(run_dir) == []

    status = run_pdbench(["status", f"dir={run_dir}"], timeout_s=120)
    assert status.returncode == 0, status.stderr
    for job in jobs:
        assert f"job {job['job_id']} ({job['deployment_id']})" in status.stdout
    assert status.stdout.count("1 ok, 0 failed") == 2
