"""A server process runs on the cores its launch spec gives it, its children included, and a
server that exits before it is healthy fails with its log tail."""

from __future__ import annotations

import os
import sys

import pytest

from jobs.serving.server import ServerProcess, ServerStartError

pytestmark = pytest.mark.unit

PRINT_CORES = (
    "import os, subprocess, sys; print('self', sorted(os.sched_getaffinity(0)), flush=True); "
    "subprocess.run([sys.executable, '-c', "
    "'import os; print(\"child\", sorted(os.sched_getaffinity(0)))'])"
)


def test_the_whole_process_tree_runs_on_the_given_cores(tmp_path):
    core = min(os.sched_getaffinity(0))
    log = tmp_path / "s.log"
    proc = ServerProcess("s", [sys.executable, "-c", PRINT_CORES], {}, log, "http://x", cpus=[core])
    with proc:
        proc.proc.wait(timeout=30)
    text = log.read_text()
    assert text.startswith(f"$ [cores {core}] {sys.executable}")  # the log says where it ran
    assert f"self [{core}]" in text and f"child [{core}]" in text


def test_cores_outside_the_task_leave_it_unpinned_and_say_so(tmp_path):
    log = tmp_path / "s.log"
    outside = max(os.sched_getaffinity(0)) + 1000
    proc = ServerProcess(
        "s", [sys.executable, "-c", PRINT_CORES], {}, log, "http://x", cpus=[outside]
    )
    with proc:
        proc.proc.wait(timeout=30)
    text = log.read_text()
    assert f"cores [{outside}] are outside this task's; not pinned" in text
    assert f"self {sorted(os.sched_getaffinity(0))}" in text


def test_a_server_that_exits_before_health_fails_with_its_log(tmp_path):
    log = tmp_path / "s.log"
    cmd = [sys.executable, "-c", "print('boom'); raise SystemExit(3)"]
    proc = ServerProcess("s", cmd, {}, log, "http://127.0.0.1:9/health")
    with proc, pytest.raises(ServerStartError, match=r"s exited with code 3 .*\n(.|\n)*boom"):
        proc.wait_until_ready(30)


def gone(pid: int, within_s: float = 15.0) -> bool:
    """Whether ``pid`` ends (exits, or is left a zombie nobody waits for) within ``within_s``."""
    import time

    import psutil

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_a_server_dies_with_the_task_that_started_it_even_when_the_task_is_sigkilled(tmp_path):
    """The task (a process that starts a server and waits) SIGKILLed: no teardown runs in
    it, yet its server ends (its parent-death signal)."""
    import signal
    import subprocess

    task = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from jobs.serving.server import ServerProcess; "
            f"s = ServerProcess('x', {SLEEPER!r}, {{}}, {str(tmp_path / 'x.log')!r}, "
            "'http://127.0.0.1:1/health').start(); print(s.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    try:
        server = int(task.stdout.readline())
        assert not gone(server, within_s=0.5)  # it runs while the task does
        task.send_signal(signal.SIGKILL)
        task.wait(timeout=10)
        assert gone(server), "the server outlived its task"
    finally:
        task.kill()
        task.wait()


def test_stop_ends_what_a_killed_leader_left_in_its_group(tmp_path):
    """An API server SIGKILLed alone leaves its engine core (here: a child that sleeps);
    the stop still ends it (the group is signalled by the leader's pid)."""
    import signal
    import time

    forks = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen({SLEEPER!r}); print(p.pid, flush=True); time.sleep(120)"
    )
    log = tmp_path / "leader.log"
    server = ServerProcess("leader", [sys.executable, "-c", forks], {}, log, "http://x/health")
    with server:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(log.read_text().splitlines()) < 2:
            time.sleep(0.1)
        child = int(log.read_text().splitlines()[-1])
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        assert not gone(child, within_s=0.5)  # orphaned, still running
    assert gone(child, within_s=5)
