"""After Ctrl-C ends a local ``pdbench serve``, nothing its job started for the run dir is
left running, even where the task was killed before it stopped every server."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from connector.process_env import RUN_DIR_ENV
from pdbench.driver.serve import stop_left_behind

pytestmark = pytest.mark.unit

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def start(run_dir: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, RUN_DIR_ENV: run_dir}
    return subprocess.Popen(SLEEPER, env=env, start_new_session=True, **kwargs)


def test_a_server_the_job_left_is_stopped_and_another_runs_is_not(tmp_path, capsys):
    mine, other = str(tmp_path / "run"), str(tmp_path / "other")
    left, kept = start(mine), start(other)
    try:
        assert stop_left_behind(mine, wait_s=10) == [left.pid]
        assert left.wait(timeout=10) is not None  # gone, not merely signalled
        assert kept.poll() is None  # another run's process runs on
        assert f"left 1 process(es) running: pid {left.pid}" in capsys.readouterr().out
        assert stop_left_behind(mine, wait_s=10) == []  # nothing the second time
    finally:
        for proc in (left, kept):
            proc.kill()
            proc.wait()


def test_one_that_ignores_sigterm_is_killed(tmp_path):
    run_dir = str(tmp_path / "run")
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(600)",
        ],
        env={**os.environ, RUN_DIR_ENV: run_dir},
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        assert stop_left_behind(run_dir, wait_s=0.5) == [stubborn.pid]
        stubborn.wait(timeout=10)
        assert not psutil.pid_exists(stubborn.pid)  # SIGKILLed (and reaped by the wait)
    finally:
        stubborn.kill()
        stubborn.wait()
