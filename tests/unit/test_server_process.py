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
