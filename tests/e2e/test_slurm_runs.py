"""P/D across the two nodes of the real local SLURM cluster, cut three times and resumed.

One cross-node sweep (P on node1, D on node2) is shared by the tests that read what
happened in it: its dry run is printed first; then one job is requeued twice, a time limit
hit mid-sweep (submitit's USR2 checkpoint) and a preemption by ``scontrol requeue`` (SLURM
restarts the same job, which starts its servers again and measures the Points not recorded
ok), then cancelled by ``scancel`` mid-sweep, which ends the command; the same command again,
with its preflight, submits a new job that measures the rest. Checked: every Point once,
none lost; the P/D pipeline across nodes token for token; the job ran the spec the dry run
printed, with each node's own address.

How each Point was written is watched while the run goes: a Point written twice would show
two ``started_at`` values. Wall times are printed (pytest -s), never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdbench.spec.launch import (
    DeploymentSpec,
    describe_deployment,
    node_address_placeholder,
    resolve,
)
from tests.e2e.conftest import (
    NO_PREFLIGHT,
    REPO,
    outputs_by_turn,
    pdbench_command,
    run_pdbench,
    server_pids,
)
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
    # Points paced by seeded arrivals (3 turns of 2 requests, 0.25/s: ~8 s of waits each):
    # the 8 Points after the first outlast SLURM's next time-limit check (<= 30 s) and leave
    # attempts 1 and 2, and the rerun, Points to measure.
    "workload.turns=3",
    "workload.request_rate=0.25",
    "workload.seed=0",
    # 10 minutes, USR2 120 s before the end (what pdbench's sbatch asks)
    "cluster.time_limit_min=10",
    "cluster.signal_delay_s=120",
]
LIMIT_MIN = 10
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
                pdbench_command(args),
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


@dataclass
class Chain:
    """The cut sweep: its dry run, the first command (the job cut three times), the rerun."""

    run_dir: Path
    dry: subprocess.CompletedProcess
    first: Run
    again: Run
    job: str  # the first command's job
    restarts: int  # SLURM's count for it once cancelled


@pytest.fixture(scope="module")
def chain(local_slurm, tmp_path_factory) -> Chain:  # noqa: F811
    """The job is submitted with a 10-minute limit and USR2 120 s before it. Once attempt 0
    has recorded a Point, the limit is brought forward to the next whole minute at least 60 s
    away (``scontrol update TimeLimit``): SLURM, which checks time limits every 30 s, then
    finds the job inside its signal window and sends USR2 itself, at least 30 s before the
    limit (submitit's checkpoint). Where the limit falls does not depend on how fast this
    machine starts servers (issue #23: 3 fixed minutes once left 2 Points an attempt). Once
    SLURM has requeued the job its limit goes back to 10 minutes; once attempt 1 has recorded
    a Point, ``scontrol requeue`` preempts it; once attempt 2 has, ``scancel`` ends it. The
    first command runs without the preflight (the rerun's job runs it on both nodes)."""
    tmp = tmp_path_factory.mktemp("slurm_chain")
    run_dir = tmp / "run"
    args = [*SWEEP, f"dir={run_dir}"]
    dry = run_pdbench([*args, "launch.dry_run=true"], timeout_s=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not (run_dir / "points").exists()  # a dry run measures nothing
    first = Run([*args, NO_PREFLIGHT], run_dir, tmp / "pdbench.log")
    first.wait_for_records(1, RUN_TIMEOUT_S)
    job = job_id(run_dir)
    try:
        ran_s = run_time_s(job)
        brought_forward = ran_s // 60 + 2  # its end 61-120 s away: inside the USR2 window
        set_time_limit(job, brought_forward)
        print(f"\ntime limit {LIMIT_MIN} -> {brought_forward} min after {ran_s} s")
        wait_for_restart(job, 300)
        set_time_limit(job, LIMIT_MIN)  # the requeued attempt: the submitted limit again
        wait_for_attempt(first, 1, RUN_TIMEOUT_S)
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)  # a preemption
        wait_for_attempt(first, 2, RUN_TIMEOUT_S)
        subprocess.run(["scancel", job], check=True, timeout=30)  # the user cancels it
    except BaseException:
        subprocess.run(["scancel", job], timeout=30)  # never leave it holding the nodes
        raise
    print(f"time limit + preemption + scancel: pdbench ran {first.finish():.0f} s")
    counted = restarts(job)
    again = Run(args, run_dir, tmp / "pdbench-again.log")
    print(f"the rerun, with its preflight: pdbench ran {again.finish():.0f} s")
    return Chain(run_dir, dry, first, again, job, counted)


def by_flow(records: list[dict], history: int) -> dict[str, dict]:
    return {r["flow"]: r for r in records if r["workload"]["history_tokens"] == history}


def test_a_time_limit_a_preemption_then_scancel_mid_sweep_and_the_rest_is_measured_once(chain):
    """Two requeues and a cancel of one job, then a rerun: attempt 0 reaches its time limit,
    attempt 1 is preempted (``scontrol requeue``), attempt 2 is cancelled (``scancel``) and
    the command fails; the same command again submits a new job that measures the rest."""
    job, output = chain.job, chain.first.output()
    assert chain.first.proc.returncode != 0, output[-4000:]  # cancelled: the command fails
    for restart in (1, 2):
        assert f"job {job} restarted by SLURM (restart {restart})" in output
    assert "skipping" in output and "Point(s) recorded ok" in output
    assert "PENDING (BeginTime)" in output  # the driver said why it waits
    assert chain.restarts == 2
    log = (chain.run_dir / "submitit" / f"{job}_0_log.out").read_text(errors="replace")
    assert log.count("this job is timed-out") == 1  # submitit's USR2 handler, attempt 0
    assert "checkpointed; the requeued job starts the servers again" in log

    assert chain.again.proc.returncode == 0, chain.again.output()[-4000:]
    assert "Point(s) recorded ok" in chain.again.output()
    records = check_every_point_measured_once(chain.first, chain.again)
    first = sorted(r["attempt"] for r in records if r["job_id"] == job)
    print(f"Points per attempt of job {job}: {[first.count(a) for a in sorted(set(first))]}")
    assert set(first) == {0, 1, 2}, first  # cut three times mid-sweep ...
    rest = [r for r in records if r["job_id"] != job]
    assert rest and len({r["job_id"] for r in rest}) == 1  # ... and one new job the rest


def test_cross_node_pd_on_two_slurm_nodes(chain):
    """P on node1, D on node2: every flow gives agg's greedy tokens, pull moves the history;
    the rerun's job ran the preflight on both nodes first, findings in the provenance."""
    run_dir = chain.run_dir
    records = chain.again.records()
    points = by_flow(records, max(HISTORIES))
    assert set(points) == {"agg", "recompute", "pull"}
    hosts = points["pull"]["hosts"]
    assert "127.0.10.1" in hosts["prefill0"] and "127.0.10.2" in hosts["decode0"], hosts
    instances = {i["name"]: i["node"] for i in points["pull"]["deployment"]["instances"]}
    assert instances == {"prefill0": 0, "decode0": 1}
    for history in HISTORIES:  # measured by whichever attempt or job: the same tokens
        mine = by_flow(records, history)
        agg = outputs_by_turn(run_dir, mine["agg"])
        for flow in ("recompute", "pull"):
            assert mine[flow]["status"] == "ok"
            assert outputs_by_turn(run_dir, mine[flow]) == agg, (history, flow)
    turn2 = next(r for r in points["pull"]["by_turn"] if r["turn"] == 2)
    assert turn2["bytes_pulled"] > 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["jobs"] and all(j["job_id"].isdigit() for j in manifest["jobs"])  # SLURM's
    nodes = manifest["provenance"]["nodes"]
    assert sorted(nodes) == ["node1", "node2"]
    for node in nodes.values():
        assert node["preflight_ok"] and node["packages"]["nixl"] and node["gpus"] == []
        assert node["address"]["address"].startswith("127.0.10.")
    assert "preflight node1 (node2) reach: found 1 other node(s) answer" in chain.again.output()
    assert server_pids(run_dir) == []


def test_on_slurm_the_job_ran_the_dry_runs_spec_with_the_nodes_addresses(chain):
    """What the dry run prints is what the job runs, on SLURM too: the dry run printed a
    placeholder where each node's address goes, the job resolved every one of them."""
    run_dir, dry = chain.run_dir, chain.dry
    records = chain.again.records()
    (spec_file,) = {r["launch_spec_file"] for r in records}  # one Deployment, every job
    ran = DeploymentSpec.from_dict(json.loads((run_dir / spec_file).read_text()))
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
    # And the sbatch file SLURM got for the rerun (the dry run's config) is the one printed.
    (rerun_job,) = {r["job_id"] for r in records} - {chain.job}
    submitted = run_dir / "submitit" / f"{rerun_job}_submission.sh"
    printed = dry.stdout.split("  sbatch script:\n", 1)[1]
    assert "\n".join("    " + line for line in submitted.read_text().splitlines()) in printed
    for inst in ran.instances:  # the servers really ran: their logs are where the spec says
        assert Path(inst.log_path).is_file(), inst.log_path
