"""Servers forked from one process that imported their module once (``server.cpu_start=fork``):
each runs as ``python -m MODULE`` would, with its own argv, whole environment, log, cores and
session; its end is reported; nothing outlives the forker, and a forker that cannot fork
says why in the server's log. The target is a small module (``forked_target``), not vLLM:
the e2e tier starts vLLM servers this way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.serving.forker import ServerForker
from jobs.serving.server import ServerProcess

pytestmark = pytest.mark.unit

TARGET = "tests.unit.forked_target"


def said(log: Path, timeout_s: float = 30) -> dict:
    """The target's JSON line in its log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("{"):
                return json.loads(line)
        time.sleep(0.05)
    raise AssertionError(f"the target said nothing in {timeout_s} s:\n{log.read_text()}")


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.fixture
def forker(tmp_path):
    with ServerForker(sys.executable, TARGET, {"FORKER_ONLY": "1"}, tmp_path / "f.log") as f:
        yield f


def test_a_forked_server_gets_its_argv_environment_log_cores_and_session(forker, tmp_path):
    log = tmp_path / "s.log"
    env = {**os.environ, "TARGET_GIVEN": "yes"}
    env.pop("FORKER_ONLY", None)
    cpus = sorted(os.sched_getaffinity(0))[:1]
    child = forker.fork(["exit3", "--flag"], env, log, cpus)
    assert child.wait(timeout=60) == 3  # its exit code, as subprocess reports it
    got = said(log)
    assert got["argv"] == ["exit3", "--flag"] and got["name"] == "__main__"
    assert got["given"] == "yes" and got["forker_only"] is None  # its env, whole
    assert got["own_session"] and got["cpus"] == cpus and got["stdin"] == os.devnull
    assert got["parent"] == forker.proc.pid and child.pid not in (None, forker.proc.pid)
    # what the module's import printed went to the forker's log, not among its replies
    assert child.pid != 1 and '{"id": 0, "pid": 1}' in (tmp_path / "f.log").read_text()
    # what every server of the forker shares is in /proc/PID/environ (status and stop
    # find a run's servers by it)
    with open(f"/proc/{forker.proc.pid}/environ", "rb") as environ:
        assert b"FORKER_ONLY=1" in environ.read().split(b"\0")


def test_a_killed_server_is_reported_and_closing_the_forker_ends_the_rest(forker, tmp_path):
    first = forker.fork(["sleep"], dict(os.environ), tmp_path / "a.log", [])
    second = forker.fork(["sleep"], dict(os.environ), tmp_path / "b.log", [])
    said(tmp_path / "a.log")
    said(tmp_path / "b.log")
    os.killpg(first.pid, signal.SIGKILL)  # its own group: the pid is its session's
    assert first.wait(timeout=30) == -signal.SIGKILL
    assert second.poll() is None and running(second.pid)
    forker.close()  # the task is done: nothing it forked outlives it
    assert second.wait(timeout=30) == -signal.SIGKILL
    assert not running(second.pid)


def test_servers_die_with_their_forker_and_a_later_one_says_why_it_never_ran(forker, tmp_path):
    child = forker.fork(["sleep"], dict(os.environ), tmp_path / "a.log", [])
    said(tmp_path / "a.log")
    os.kill(forker.proc.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL  # its parent-death signal
    deadline = time.monotonic() + 10
    while running(child.pid):
        assert time.monotonic() < deadline, "the server outlived its forker"
        time.sleep(0.05)
    late = forker.fork(["exit3"], dict(os.environ), tmp_path / "late.log", [])
    assert late.wait(timeout=10) != 0 and late.pid is None
    assert "ended (code -9) before it could fork this one" in (tmp_path / "late.log").read_text()


def test_a_module_that_does_not_import_fails_each_server_with_the_forkers_traceback(tmp_path):
    log = tmp_path / "f.log"
    with ServerForker(sys.executable, "no_such_module_here", {}, log) as forker:
        child = forker.fork(["x"], dict(os.environ), tmp_path / "s.log", [])
        assert child.wait(timeout=60) == 1
    text = (tmp_path / "s.log").read_text()
    assert f"its log: {log}" in text
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in text


def test_server_process_forks_only_python_dash_m_of_the_forkers_module(forker, tmp_path):
    mine = [sys.executable, "-m", TARGET, "exit3"]
    other = [sys.executable, "-m", "json.tool", "--help"]
    assert forker.can_fork(mine) and not forker.can_fork(other)
    assert not forker.can_fork(["python3", "-m", TARGET])  # another interpreter
    url = "http://127.0.0.1:1/"
    with ServerProcess("t", mine, {}, tmp_path / "t.log", url, forker=forker) as t:
        assert t.proc.wait(timeout=60) == 3
    assert "pdbench: forked from pid" in (tmp_path / "t.log").read_text()
    with ServerProcess("o", other, {}, tmp_path / "o.log", url, forker=forker) as o:
        assert isinstance(o.proc, subprocess.Popen)
        o.proc.wait(timeout=60)
