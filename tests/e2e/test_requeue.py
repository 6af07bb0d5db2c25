"""Requeue and cancel on the real local SLURM cluster: a time limit hit mid-sweep
(submitit's USR2 checkpoint) and a preemption by ``scontrol requeue``, where SLURM restarts
the same job, which starts its servers again and measures the Points not recorded ok; then
``scancel`` mid-sweep, which ends the command, and a rerun that measures the rest. Every
Point once, none lost.

How each Point was written is watched while the run goes: a Point written twice would show
two ``started_at`` values. Wall times are printed (pytest -s), never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import NO_PREFLIGHT, REPO, server_pids
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slurm]

HISTORIES = [0, 64, 128]
FLOWS = 3  # smoke: agg, recompute, pull
SWEEP = [
    "+experiment=smoke",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "cluster=slurm",
    "topology.placement=cross_node",  # two SLURM nodes: rank 1 is requeued too
    "workload.conversations=2",
    "workload.concurrency=2",
    f"workload.history_tokens=[{','.join(map(str, HISTORIES))}]",
]
RUN_TIMEOUT_S = 1200  # up to 4 attempts of 3 minutes (submitit requeues 3 times at most)


class Run:
    """``python -m pdbench ARGS`` in the background, its output in a file, its records
    watched: every (point id, started_at) seen, and when."""

    def __init__(self, args: list[str], run_dir: Path, log: Path):
        self.run_dir = run_dir
        self.log = log
        self.start = time.monotonic()
        self.writes: dict[str, set[float]] = {}
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pdbench", *args],
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def watch(self) -> None:
        for path in (self.run_dir / "points").glob("*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # renamed into place: a reader sees the old file or the new one
            self.writes.setdefault(record["point_id"], set()).add(record["started_at"])

    def records(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in (self.run_dir / "points").glob("*.json")]

    def wait_for_records(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.records()) < n:
            assert self.proc.poll() is None, self.output()[-3000:]
            assert time.monotonic() < deadline, f"fewer than {n} record(s) in {timeout_s} s"
            self.watch()
            time.sleep(0.2)

    def finish(self, timeout_s: float = RUN_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout_s
        try:
            while self.proc.poll() is None:
                assert time.monotonic() < deadline, "pdbench did not finish"
                self.watch()
                time.sleep(0.2)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)
        self.watch()
        return time.monotonic() - self.start

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def job_id(run_dir: Path) -> str:
    return json.loads((run_dir / "manifest.json").read_text())["jobs"][0]["job_id"]


def restarts(job: str) -> int:
    out = subprocess.run(
        ["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, timeout=30
    ).stdout
    field = next(f for f in out.split() if f.startswith("Restarts="))
    return int(field.split("=", 1)[1])


def check_every_point_measured_once(*runs: Run) -> list[dict]:
    """Every Point of the runs' run dir ok and written once, whichever run wrote it."""
    run = runs[-1]
    records = run.records()
    assert len(records) == len(HISTORIES) * FLOWS  # none lost
    assert {r["status"] for r in records} == {"ok"}, [r["error"][:300] for r in records]
    writes: dict[str, set[float]] = {}
    for each in runs:
        for point_id, started in each.writes.items():
            writes.setdefault(point_id, set()).update(started)
    for r in records:
        assert writes[r["point_id"]] == {r["started_at"]}, r["point_id"]  # written once
        lines = (run.run_dir / r["requests_file"]).read_text().splitlines()
        assert len(lines) == r["workload"]["conversations"] * r["workload"]["turns"]
    assert server_pids(run.run_dir) == []
    return records


def run_time_s(job: str) -> int:
    """How long the job's current attempt has run (``RunTime``), in seconds."""
    out = subprocess.run(
        ["scontrol", "show", "job", job, "-o"], capture_output=True, text=True, timeout=30
    ).stdout
    field = next(f for f in out.split() if f.startswith("RunTime="))
    days, _, clock = field.split("=", 1)[1].rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def set_time_limit(job: str, minutes: int) -> None:
    subprocess.run(
        ["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True, timeout=30
    )


def wait_for_restart(job: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while restarts(job) < 1:
        assert time.monotonic() < deadline, f"job {job} not requeued in {timeout_s} s"
        time.sleep(0.5)


def wait_for_attempt(run: Run, attempt: int, timeout_s: float) -> None:
    """Until a Point of ``attempt`` is recorded."""
    deadline = time.monotonic() + timeout_s
    while not any(r.get("attempt") == attempt for r in run.records()):
        assert run.proc.poll() is None, run.output()[-3000:]
        assert time.monotonic() < deadline, f"no Point of attempt {attempt} in {timeout_s} s"
        run.watch()
        time.sleep(0.2)


def test_a_time_limit_a_preemption_then_scancel_mid_sweep_and_the_rest_is_measured_once(
    local_slurm,  # noqa: F811
    tmp_path,
):
    """Two requeues and a cancel of one job, then a rerun: attempt 0 reaches its time limit,
    attempt 1 is preempted (``scontrol requeue``), attempt 2 is cancelled (``scancel``) and
    the command fails; the same command again submits a new job that measures the rest.

    The job is submitted with a 10-minute limit and USR2 120 s before it (what pdbench's
    sbatch asks). Once attempt 0 has recorded a Point, the test brings the limit forward to
    the next whole minute at least 60 s away (``scontrol update TimeLimit``): SLURM, which
    checks time limits every 30 s, then finds the job inside its signal window and sends
    USR2 itself, at least 30 s before the limit (submitit's checkpoint). Where the limit
    falls does not depend on how fast this machine starts servers (issue #23: 3 fixed
    minutes once left 2 Points an attempt). Once SLURM has requeued the job its limit goes
    back to 10 minutes; once attempt 1 has recorded a Point, ``scontrol requeue`` preempts
    it; once attempt 2 has, ``scancel`` ends it. The requeued job's preflight is the
    cross-node run's subject (test_slurm_dispatch), not this one's."""
    run_dir = tmp_path / "run"
    limit_min = 10
    limit = [f"cluster.time_limit_min={limit_min}", "cluster.signal_delay_s=120"]
    # Points paced by seeded arrivals (3 turns of 2 requests, 0.25/s: ~8 s of waits each):
    # the 8 Points after the first outlast SLURM's next time-limit check (<= 30 s) and leave
    # attempts 1 and 2 Points to be cut in.
    paced = ["workload.turns=3", "workload.request_rate=0.25", "workload.seed=0"]
    args = [*SWEEP, *paced, *limit, NO_PREFLIGHT, f"dir={run_dir}"]
    run = Run(args, run_dir, tmp_path / "pdbench.log")
    run.wait_for_records(1, RUN_TIMEOUT_S)
    job = job_id(run_dir)
    try:
        ran_s = run_time_s(job)
        brought_forward = ran_s // 60 + 2  # its end 61-120 s away: inside the USR2 window
        set_time_limit(job, brought_forward)
        print(f"\ntime limit {limit_min} -> {brought_forward} min after {ran_s} s")
        wait_for_restart(job, 300)
        set_time_limit(job, limit_min)  # the requeued attempt: the submitted limit again
        wait_for_attempt(run, 1, RUN_TIMEOUT_S)
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)  # a preemption
        wait_for_attempt(run, 2, RUN_TIMEOUT_S)
        subprocess.run(["scancel", job], check=True, timeout=30)  # the user cancels it
    except BaseException:
        subprocess.run(["scancel", job], timeout=30)  # never leave it holding the nodes
        raise
    took = run.finish()
    output = run.output()
    print(f"time limit + preemption + scancel: pdbench ran {took:.0f} s")
    assert run.proc.returncode != 0, output[-4000:]  # cancelled: the command fails
    assert server_pids(run_dir) == []
    for restart in (1, 2):
        assert f"job {job} restarted by SLURM (restart {restart})" in output
    assert "skipping" in output and "Point(s) recorded ok" in output
    assert "PENDING (BeginTime)" in output  # the driver said why it waits
    assert restarts(job) == 2
    log = (run_dir / "submitit" / f"{job}_0_log.out").read_text(errors="replace")
    assert log.count("this job is timed-out") == 1  # submitit's USR2 handler, attempt 0
    assert "checkpointed; the requeued job starts the servers again" in log

    again = Run(args, run_dir, tmp_path / "pdbench-again.log")
    took = again.finish()
    print(f"the rerun: pdbench ran {took:.0f} s")
    assert again.proc.returncode == 0, again.output()[-4000:]
    assert "Point(s) recorded ok" in again.output()
    records = check_every_point_measured_once(run, again)
    first = sorted(r["attempt"] for r in records if r["job_id"] == job)
    print(f"Points per attempt of job {job}: {[first.count(a) for a in sorted(set(first))]}")
    assert set(first) == {0, 1, 2}, first  # cut three times mid-sweep ...
    rest = [r for r in records if r["job_id"] != job]
    assert rest and len({r["job_id"] for r in rest}) == 1  # ... and one new job the rest
