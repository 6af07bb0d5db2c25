"""Fault injection on real servers: nothing is lost, nothing hangs, nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess

import psutil
import pytest

from tests.e2e.conftest import (
    NO_PREFLIGHT,
    REPO,
    kill_processes_under,
    pdbench_command,
    processes_under,
    run_pdbench,
    server_pids,
    wait_for_line,
)

pytestmark = pytest.mark.e2e

SMALL = [
    "+experiment=smoke",
    "workload.conversations=2",
    "workload.concurrency=2",
    "workload.turns=2",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    NO_PREFLIGHT,
]


def start_pdbench(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        pdbench_command(args),
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def ok_ids(run_dir: Path) -> set[str]:
    """The Points recorded ok so far (a record being renamed into place is skipped)."""
    ids = set()
    for path in (run_dir / "points").glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if record["status"] == "ok":
            ids.add(record["point_id"])
    return ids


def wait_for_a_new_ok_point(
    run_dir: Path, before: set[str], proc: subprocess.Popen, timeout_s: float = 600
) -> None:
    """Until this run has recorded a Point ok that was not ok before it started."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok_ids(run_dir) - before:
            return
        if proc.poll() is not None:
            pytest.fail(f"pdbench ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"no new Point recorded ok after {timeout_s} s")


def server_on_port(run_dir: Path, port: int) -> psutil.Process:
    """The API server listening on ``port``: not its engine core, a child that holds the
    same socket (a server forked from ``jobs.serving.forkserver`` carries the forker's
    command line, so the port, not the command line, says which server it is)."""
    listening = [pid for pid in server_pids(run_dir) if listens(pid, port)]
    listening += [
        child.pid
        for pid in listening
        for child in psutil.Process(pid).children(recursive=True)
        if listens(child.pid, port)
    ]
    for pid in listening:
        proc = psutil.Process(pid)
        if proc.ppid() not in listening:
            return proc
    raise AssertionError(f"no vLLM server on port {port}")


def listens(pid: int, port: int) -> bool:
    try:
        conns = psutil.Process(pid).net_connections("tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def port_held(port: int) -> bool:
    """Whether anything listens on ``port`` (a server, or an engine core with its socket)."""
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.net_connections("tcp")
    )


def left_behind(run_dir: Path, ports: list[int], within_s: float = 15.0) -> list[str]:
    """What of the run is still alive ``within_s`` after its end: servers by pid, ports."""
    deadline = time.monotonic() + within_s
    while True:
        left = [f"pid {p}" for p in server_pids(run_dir)]
        left += [f"port {p}" for p in ports if port_held(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def torn_files(run_dir: Path) -> list[str]:
    """Point records that do not parse (half-written) and temporary files left behind."""
    torn = [p.name for p in (run_dir / "points").glob(".*")]
    for path in (run_dir / "points").glob("*.json"):
        try:
            json.loads(path.read_text())
        except json.JSONDecodeError:
            torn.append(path.name)
    return torn


def records(run_dir: Path) -> dict[str, dict]:
    """Every Point record by file name."""
    return {p.name: json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")}


# The faults share one run dir, one after the other, each run resuming the last: P killed
# mid-Point, D killed mid-Point, D's API server killed alone (its engine core lives on),
# the driver's process group SIGKILLed, SIGTERM to the driver mid-Point, then a run that
# completes on the same ports. Six Points (3 flows x 2 history lengths), so that each
# faulted run has measured one Point ok and has one in progress when its fault comes. Ports
# of their own: a server another test leaked on the defaults fails no fault test. A request
# D dies under
# while it streams keeps its client waiting to the request timeout (the router logs a 502
# but leaves the client's stream open): 30 s instead of 120 bounds that wait; a request
# here takes well under a second.
P_PORT, D_PORT = 8780, 8781
FAULTED = [
    *SMALL,
    "workload.history_tokens=[0,64]",
    "workload.request_timeout_s=30",
    f"server.base_port={P_PORT}",
    "server.side_channel_base_port=5980",
    "server.router_port=8680",
    "server.vllm_base_port=19480",
]


@dataclass
class Faulted:
    """One run of the chain, from its start to its end after the fault."""

    started: float  # time.time() at its start
    returncode: int
    output: str
    kept: dict[str, int]  # the Points recorded ok before the fault: file name -> mtime
    records: dict[str, dict]  # every record as the run left them
    torn: list[str]  # records half-written or temporary files left behind
    servers_left: list[str]  # servers by pid, and their ports, still held 15 s after its end
    processes_left: list[str]  # anything started for the run still alive: jobs, servers
    fault_at: float  # time.time() of the fault


def kill_server(port: int) -> Callable[[Path, subprocess.Popen], None]:
    def fault(run_dir: Path, proc: subprocess.Popen) -> None:
        server = server_on_port(run_dir, port)
        os.killpg(os.getpgid(server.pid), signal.SIGKILL)

    return fault


def kill_api_server_alone(port: int) -> Callable[[Path, subprocess.Popen], None]:
    """SIGKILL the API server only: its engine core lives on, holding the listening socket
    (requests to the port then hang instead of failing)."""

    def fault(run_dir: Path, proc: subprocess.Popen) -> None:
        os.kill(server_on_port(run_dir, port).pid, signal.SIGKILL)

    return fault


def kill_the_drivers_group(run_dir: Path, proc: subprocess.Popen) -> None:
    """SIGKILL to the driver's whole process group (the driver, submitit's controller, the
    task): nothing of pdbench runs a teardown; the servers must still end."""
    os.killpg(proc.pid, signal.SIGKILL)


def sigterm_the_driver(run_dir: Path, proc: subprocess.Popen) -> None:
    """SIGTERM to the pdbench driver alone (``kill``, a CI timeout): it stops its local job
    with SIGTERM (``stop_job``), which the job's controller forwards to its task, as SLURM
    does to a preempted job's tasks; the task tears its servers down."""
    proc.send_signal(signal.SIGTERM)


def run_until(run_dir: Path, args: list[str], fault) -> Faulted:
    """Start pdbench on ``run_dir``; once it has measured a Point ok, inject ``fault``.
    What is still running when pdbench has ended is left behind."""
    before, started = ok_ids(run_dir), time.time()
    proc = start_pdbench(args)
    try:
        wait_for_a_new_ok_point(run_dir, before, proc)  # a Point of this run is done
        kept = {
            name: (run_dir / "points" / name).stat().st_mtime_ns
            for name, r in records(run_dir).items()
            if r["status"] == "ok"
        }
        fault_at = time.time()
        fault(run_dir, proc)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    left, alive = left_behind(run_dir, [P_PORT, D_PORT]), processes_under(run_dir.parent)
    return Faulted(
        started,
        proc.returncode,
        out,
        kept,
        records(run_dir),
        torn_files(run_dir),
        left,
        alive,
        fault_at,
    )


@pytest.fixture(scope="module")
def fault_chain(tmp_path_factory) -> Iterator[tuple[Path, dict[str, Faulted], CompletedProcess]]:
    run_dir = tmp_path_factory.mktemp("faults") / "run"
    args = [*FAULTED, f"dir={run_dir}"]
    try:
        faulted = {}
        faulted["prefill_killed"] = run_until(run_dir, args, kill_server(P_PORT))
        faulted["decode_killed"] = run_until(run_dir, args, kill_server(D_PORT))
        faulted["decode_api_killed"] = run_until(run_dir, args, kill_api_server_alone(D_PORT))
        faulted["driver_group_killed"] = run_until(run_dir, args, kill_the_drivers_group)
        # the driver waits for its job's teardown before it exits: no settling time
        faulted["driver_sigterm"] = run_until(run_dir, args, sigterm_the_driver)
        last = run_pdbench(args, 900)  # the same ports again: nothing holds them
        yield run_dir, faulted, last
    finally:
        kill_processes_under(run_dir.parent)  # a run cut short leaves nothing behind


def resumed_to_the_end(run_dir: Path, last: CompletedProcess, run: Faulted) -> None:
    """The runs after ``run`` measured the rest: every Point ok, none it had recorded ok
    measured again, no server left."""
    assert last.returncode == 0, last.stdout[-3000:]
    now = records(run_dir)
    assert len(now) == 6 and {r["status"] for r in now.values()} == {"ok"}
    for name, mtime in run.kept.items():  # recorded ok: not measured again
        assert (run_dir / "points" / name).stat().st_mtime_ns == mtime, name
    assert server_pids(run_dir) == []


def test_an_api_server_killed_alone_fails_its_point_at_once_and_its_engine_core_goes(
    fault_chain,
):
    """Its engine core would keep the port's socket, and requests there would hang to their
    timeout: it follows its API server (its own parent-death signal), the requests fail at
    once, the task names the dead server (DEAD_POLL_S; a load still hanging is cut after
    DEAD_GRACE_S). The bound is functional: well under the 30 s request timeout the load
    would otherwise wait out."""
    run_dir, faulted, last = fault_chain
    run = faulted["decode_api_killed"]
    assert run.returncode != 0, run.output[-2000:]
    failed = [r for r in run.records.values() if r["status"] == "failed"]
    (failed,) = [r for r in failed if r["started_at"] >= run.started]
    assert failed["error"].startswith("server(s) died during the point: ['decode0 (node 0)']")
    assert failed["finished_at"] - run.fault_at < 20, failed["finished_at"] - run.fault_at
    assert run.servers_left == [] and run.torn == []
    resumed_to_the_end(run_dir, last, run)


def test_sigkill_of_the_drivers_process_group_leaves_no_server_behind(fault_chain):
    """kill -9 of the driver's group: no teardown runs in pdbench, yet every server and
    the router end (their parent-death signal) and free their ports within 15 s; the next
    run on the same ports measures the rest."""
    run_dir, faulted, last = fault_chain
    run = faulted["driver_group_killed"]
    assert run.returncode == -signal.SIGKILL
    assert run.servers_left == [], run.servers_left
    resumed_to_the_end(run_dir, last, run)


@pytest.mark.parametrize("which", ["prefill_killed", "decode_killed"])
def test_server_killed_mid_point_fails_that_point_then_resume_completes(fault_chain, which):
    run_dir, faulted, last = fault_chain
    run = faulted[which]
    assert run.returncode != 0, run.output[-2000:]
    assert run.kept and all(run.records[name]["status"] == "ok" for name in run.kept)
    failed = [r for r in run.records.values() if r["status"] == "failed"]
    failed = [r for r in failed if r["started_at"] >= run.started]  # this run's
    assert failed and all(r["error"] for r in failed)
    assert any("died" in r["error"] or "failed" in r["error"] for r in failed)
    assert run.torn == []
    assert run.servers_left == []
    resumed_to_the_end(run_dir, last, run)


def test_sigterm_to_the_driver_stops_its_job_leaves_nothing_and_resume_completes(fault_chain):
    """SIGTERM to the driver mid-Point (issue 23: the job and its vLLM servers kept running,
    and the next run on the same ports failed with "server(s) died"): the driver stops its
    job, which tears its servers down, and exits 128 + SIGTERM once nothing is left; the
    next run, on the same ports, measures the rest."""
    run_dir, faulted, last = fault_chain
    run = faulted["driver_sigterm"]
    assert run.returncode == 128 + signal.SIGTERM, run.output[-3000:]
    assert "[pdbench] SIGTERM: stopping the jobs this launch follows" in run.output
    assert run.processes_left == [], run.output[-3000:]
    assert run.servers_left == []
    assert run.torn == []
    resumed_to_the_end(run_dir, last, run)
    assert processes_under(run_dir.parent) == []


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_on_failure_policy_decides_whether_later_deployments_start(tmp_path, policy):
    """Servers that never start (a flag vLLM rejects) fail their Deployment with the server's
    own log tail, in bounded time; ``launch.on_failure`` decides whether the next one starts."""
    run_dir = tmp_path / "run"
    start = time.monotonic()
    args = [
        *SMALL,
        "flow.kv_recompute_threshold=[0,1024]",  # two deployments, one after the other
        "server.extra_args=[--no-such-flag]",  # neither can start
        f"launch.on_failure={policy}",
        f"dir={run_dir}",
    ]
    proc = run_pdbench(args, 900)
    assert proc.returncode != 0
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    started = {r["deployment"]["kv_recompute_threshold"] for r in records}
    # bounded: each server exits, nobody waits it out
    assert time.monotonic() - start < 300 * len(started)
    assert {r["flow"] for r in records} == {"agg", "recompute", "pull"}
    for r in records:
        assert r["status"] == "failed"
        assert "deployment did not start" in r["error"]
        assert "exited with code" in r["error"]
        assert "unrecognized arguments" in r["error"]  # the server's own log tail
    if policy == "stop":
        assert started == {0}, started  # the second deployment never started ...
        assert "launch.on_failure=stop: not starting" in proc.stdout
        status = run_pdbench(["status", f"dir={run_dir}"], 120)
        assert "pending" in status.stdout  # ... and its Points wait for a rerun
    else:
        assert started == {0, 1024}, started
    assert server_pids(run_dir) == []


@pytest.fixture
def own_disk(tmp_path: Path) -> Iterator[Path]:
    """A small file system of its own (tmpfs: root, as the local SLURM cluster needs too)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"no tmpfs can be mounted here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_disk_that_fills_mid_run_is_one_line_and_the_records_stay_whole(own_disk: Path):
    """The run dir's disk fills while the second Point runs: the run ends with one pdbench
    line (the file, the space left, the fix; no traceback), every record written is whole,
    no server is left, and once there is room the rerun skips the Points kept and runs the
    rest."""
    run_dir = own_disk / "run"
    proc = start_pdbench([*SMALL, f"dir={run_dir}"])
    try:
        seen = wait_for_line(proc, "point [2/3]", 900)
        filler = own_disk / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(seen) + out
    assert proc.returncode == 1, out[-3000:]
    (line,) = [x for x in out.splitlines() if x.startswith("[pdbench] job ") and " failed: " in x]
    assert "no space left on the device" in line and str(run_dir) in line, line
    assert "free of 16.0 MiB" in line and "rerun with dir=" in line, line
    assert "Traceback" not in out
    for record in (run_dir / "points").glob("*.json"):
        json.loads(record.read_text())  # whole: atomic writes
    kept = ok_ids(run_dir)
    assert len(kept) >= 1 and server_pids(run_dir) == []
    filler.unlink()  # room again: the rerun reads what was kept and plans only the rest
    # (its dry run: a rerun that measures the rest is the fault chain's, after five cuts)
    rerun = run_pdbench([*SMALL, f"dir={run_dir}", "launch.dry_run=true"], 300)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    head = f"{len(kept)} Point(s) recorded ok are skipped, {3 - len(kept)} run"
    assert head in rerun.stdout, rerun.stdout[-3000:]
    assert all(f"skip {pid} (ok)" in rerun.stdout for pid in kept), rerun.stdout[-3000:]
