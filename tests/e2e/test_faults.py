"""Fault injection on real servers: nothing is lost, nothing hangs, nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import REPO, SERVER_MODULE, load_points, run_pdbench, server_pids

pytestmark = pytest.mark.e2e

SMALL = [
    "+experiment=smoke",
    "workload.conversations=2",
    "workload.concurrency=2",
    "workload.turns=2",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
]


def start_pdbench(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pdbench", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def wait_for_points(run_dir: Path, n: int, proc: subprocess.Popen, timeout_s: float = 600):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list((run_dir / "points").glob("*.json"))) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"pdbench ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.5)
    pytest.fail(f"no {n} point record(s) after {timeout_s} s")


def server_on_port(run_dir: Path, port: int) -> psutil.Process:
    for pid in server_pids(run_dir):
        cmd = psutil.Process(pid).cmdline()
        if SERVER_MODULE in cmd and "--port" in cmd and cmd[cmd.index("--port") + 1] == str(port):
            return psutil.Process(pid)
    raise AssertionError(f"no vLLM server on port {port}")


def no_torn_files(run_dir: Path) -> None:
    for path in (run_dir / "points").glob("*.json"):
        json.loads(path.read_text())  # parses: never half-written
    assert not list((run_dir / "points").glob(".*")), "temporary files left behind"


def test_server_that_never_starts_fails_the_deployment_with_its_log(tmp_path):
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = run_pdbench([*SMALL, f"dir={run_dir}", "server.extra_args=[--no-such-flag]"], 600)
    assert proc.returncode != 0
    assert time.monotonic() - start < 300  # bounded: the server exits, nobody waits it out
    points = load_points(run_dir)
    assert set(points) == {"agg", "recompute", "pull"}
    for p in points.values():
        assert p["status"] == "failed"
        assert "deployment did not start" in p["error"]
        assert "exited with code" in p["error"]
        assert "unrecognized arguments" in p["error"]  # the server's own log tail
    assert server_pids(run_dir) == []


@pytest.mark.parametrize("port", [8100, 8101], ids=["prefill_killed", "decode_killed"])
def test_server_killed_mid_point_fails_that_point_then_resume_completes(tmp_path, port):
    run_dir = tmp_path / "run"
    args = [*SMALL, f"dir={run_dir}"]
    proc = start_pdbench(args)
    try:
        wait_for_points(run_dir, 1, proc)  # the run order's first Point is done
        (first_file,) = (run_dir / "points").glob("*.json")
        server = server_on_port(run_dir, port)
        os.killpg(os.getpgid(server.pid), signal.SIGKILL)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, out[-2000:]
    points = load_points(run_dir)
    assert json.loads(first_file.read_text())["status"] == "ok"
    failed = [p for p in points.values() if p["status"] == "failed"]
    assert failed and all(p["error"] for p in failed)
    assert any("died" in p["error"] or "failed" in p["error"] for p in failed)
    no_torn_files(run_dir)
    assert server_pids(run_dir) == []
    first_mtime = first_file.stat().st_mtime_ns
    again = run_pdbench(args, 900)
    assert again.returncode == 0, again.stdout[-3000:]
    points = load_points(run_dir)
    assert {p["status"] for p in points.values()} == {"ok"}
    assert first_file.stat().st_mtime_ns == first_mtime  # recorded ok: not measured again
    assert server_pids(run_dir) == []


def test_sigterm_to_the_job_tears_down_and_resume_completes(tmp_path):
    run_dir = tmp_path / "run"
    args = [*SMALL, f"dir={run_dir}"]
    proc = start_pdbench(args)
    try:
        wait_for_points(run_dir, 1, proc)
        # The submitit task running the deployment job (as SLURM preemption signals it).
        tasks = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "submitit" in " ".join(p.cmdline()) and SERVER_MODULE not in " ".join(p.cmdline())
        ]
        assert tasks, "no submitit task process found"
        for task in tasks:
            task.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while server_pids(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert server_pids(run_dir) == [], out[-2000:]
    no_torn_files(run_dir)
    again = run_pdbench(args, 900)
    assert again.returncode == 0, again.stdout[-3000:]
    assert {p["status"] for p in load_points(run_dir).values()} == {"ok"}


@pytest.mark.parametrize("policy", ["stop", "continue"])
def test_on_failure_policy_decides_whether_later_deployments_start(tmp_path, policy):
    run_dir = tmp_path / "run"
    args = [
        *SMALL,
        "flow.kv_recompute_thresholds=[0,1024]",  # two deployments, one after the other
        "server.extra_args=[--no-such-flag]",  # neither can start
        f"launch.on_failure={policy}",
        f"dir={run_dir}",
    ]
    proc = run_pdbench(args, 600)
    assert proc.returncode != 0
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    started = {r["deployment"]["kv_recompute_threshold"] for r in records}
    assert {r["status"] for r in records} == {"failed"}
    if policy == "stop":
        assert started == {0}, started  # the second deployment never started ...
        assert "launch.on_failure=stop: not starting" in proc.stdout
        status = run_pdbench(["status", f"dir={run_dir}"], 120)
        assert "pending" in status.stdout  # ... and its Points wait for a rerun
    else:
        assert started == {0, 1024}, started
    assert server_pids(run_dir) == []
