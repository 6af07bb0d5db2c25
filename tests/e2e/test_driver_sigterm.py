"""SIGTERM to the driver (``kill``, a CI timeout; not Ctrl-C) stops its local job and the
job's servers before it exits, and a second run on the same ports works (issue 23: the job
and its vLLM servers kept running, and the next run failed with "server(s) died")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.conftest import REPO, load_points, run_pdbench, server_pids

pytestmark = pytest.mark.e2e

# Ports of its own: a server another test leaked on the defaults fails nothing here.
ARGS = [
    "+experiment=smoke",
    "workload.conversations=2",
    "workload.concurrency=2",
    "workload.turns=2",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "launch.preflight=false",  # not a preflight test (test_preflight.py, the smoke run)
    "server.base_port=8790",
    "server.side_channel_base_port=6080",
    "server.router_port=8690",
    "server.vllm_base_port=19680",
]


def processes_under(root: Path) -> list[str]:
    """Every live process started for a run under ``root`` (its path in the command line or
    in ``PDBENCH_RUN_DIR``): the job's controller and tasks, servers, the router."""
    prefix, found = f"{root}{os.sep}", []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info.get("cmdline") or [])
            if prefix in cmd or proc.environ().get("PDBENCH_RUN_DIR", "").startswith(prefix):
                found.append(f"{proc.info['pid']}: {cmd[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_sigterm_to_the_driver_leaves_nothing_and_the_same_ports_work_again(tmp_path):
    run_dir = tmp_path / "run"
    args = [*ARGS, f"dir={run_dir}"]
    driver = subprocess.Popen(
        [sys.executable, "-m", "pdbench", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the signal goes to the driver alone, not to a group
    )
    deadline = time.monotonic() + 600
    while len(server_pids(run_dir)) < 3:  # P, D and the router up
        assert driver.poll() is None, driver.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the servers never came up"
        time.sleep(1.0)
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=240)
    assert driver.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "[pdbench] SIGTERM: stopping the jobs this launch follows" in out
    assert processes_under(tmp_path) == [], out[-3000:]

    again = run_pdbench(args)  # the same ports: nothing holds them
    assert again.returncode == 0, (again.stdout[-3000:], again.stderr[-3000:])
    assert {p["status"] for p in load_points(run_dir).values()} == {"ok"}
    assert processes_under(tmp_path) == []
