"""Progress while waiting: servers starting (who is up, seconds, last log line), a SLURM job
in the queue (state, reason, place), a job log that starts again after a requeue."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from jobs.serving.server import ServerProcess, ServerStartError, startup_line, wait_all_ready
from pdbench.driver import progress
from pdbench.driver.executors import SlurmJob, SlurmStateWatcher
from pdbench.driver.progress import _new_lines, left_the_queue, queue_line

pytestmark = pytest.mark.unit

ROWS = [
    "7|RUNNING|None|pdbench|100",
    "9_1|PENDING|Priority|pdbench|300",
    "12|PENDING|Resources|pdbench|200",
    "13|PENDING|Priority|other|900",
    "14|PENDING|Priority|pdbench|50",
]


def test_a_pending_job_says_state_reason_and_place_in_its_partition():
    assert queue_line("12", ROWS) == (
        "job 12 PENDING (Resources), 2nd of 3 pending in partition pdbench"
    )
    assert queue_line("9_1", ROWS).endswith("1st of 3 pending in partition pdbench")
    assert queue_line("7", ROWS) is None  # running: its own lines speak
    assert queue_line("99", ROWS) is None  # not listed (ended)
    requeued = ["12|PENDING|BeginTime|pdbench|200"]
    assert (
        queue_line("12", requeued)
        == "job 12 PENDING (BeginTime), 1st of 1 pending in partition pdbench"
    )


def test_a_job_the_queue_no_longer_lists_has_ended():
    # Looked at at once (scancel'led, failed): submitit's own state query may be a minute off.
    assert left_the_queue({"7", "9_1", "99", "9_2"}, ROWS) == {"99", "9_2"}
    assert left_the_queue({"7"}, []) == {"7"}
    assert left_the_queue(set(), ROWS) == set()


def test_only_slurm_jobs_are_looked_for_in_the_queue(monkeypatch):
    # A local job (its id a pid) is never in squeue: it must not count as gone, nor make a
    # local run ask squeue at all.
    asked = []

    def squeue(cmd, **kwargs):
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=listing, stderr="")

    monkeypatch.setattr(progress.subprocess, "run", squeue)
    watch = progress.QueueWatch(["123"])
    watch.squeue = True
    listing = "123|RUNNING|None|pdbench|1\n"
    assert watch.poll({"123", "4567"}) == [] and watch.gone == set()
    listing, watch.next_poll = "", 0.0
    watch.poll({"123", "4567"})
    assert watch.gone == {"123"}
    local = progress.QueueWatch([])
    local.squeue = True
    asked.clear()
    assert local.poll({"4567"}) == [] and local.gone == set() and asked == []


class SqueueSays(SlurmStateWatcher):
    """The job-state watcher pdbench's SLURM jobs use, reading a fixed ``squeue`` answer."""

    def __init__(self) -> None:
        super().__init__(delay_s=60)
        self.source = "squeue"
        self.state = "RUNNING"

    def _make_command(self) -> list[str]:
        return ["echo", f"123|{self.state}|node[1-2]"]


def test_a_job_of_two_tasks_that_left_the_queue_is_seen_ended_now(tmp_path, monkeypatch):
    # The chain of e2e test_slurm_runs.py: scancel'led, its two tasks gone within a second,
    # yet the driver said so ~55 s later. submitit's done(force_check=True) asks each task's
    # own view, which reads the watcher's cache; pdbench's SlurmJob queries SLURM first.
    watcher = SqueueSays()
    monkeypatch.setattr(SlurmJob, "watcher", watcher)
    job = SlurmJob(folder=tmp_path, job_id="123", tasks=(0, 1))
    assert not job.done(force_check=True)  # running
    watcher._start_time -= 1000  # submitted long ago: submitit looks again once a minute
    watcher._last_status_check -= 5  # and last looked 5 s ago
    watcher.state = "CANCELLED"
    assert not job.done()  # the watcher's cache, a minute late
    assert job.done(force_check=True)  # asked now


def test_a_log_that_starts_again_is_read_from_its_start(tmp_path):
    log = tmp_path / "12_0_log.out"
    log.write_text("[pdbench] one\n[pdbench] two\n")
    lines, offset = _new_lines(log, 0)
    assert lines == ["[pdbench] one", "[pdbench] two"]
    log.write_text("[pdbench] again\n")  # truncated by the requeued job
    assert _new_lines(log, offset) == (["[pdbench] again"], len("[pdbench] again\n"))


def test_the_startup_line_names_who_is_up_and_what_the_others_log():
    assert startup_line(20.4, ["prefill0"], {"decode0": "Loading weights", "agg0": ""}) == (
        "servers starting, 20 s: up prefill0; decode0 starting (Loading weights); agg0 starting"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_waiting_reports_while_servers_start_and_fails_fast_when_one_exits(tmp_path):
    port = free_port()
    slow = ServerProcess(
        "slow",
        [
            "sh",
            "-c",
            f"echo loading weights; sleep 1.5; exec {sys.executable} -m http.server "
            f"--bind 127.0.0.1 {port}",
        ],
        {},
        tmp_path / "slow.log",
        f"http://127.0.0.1:{port}/",
    )
    reports: list[str] = []
    with slow:
        took = wait_all_ready([slow], 60, reports.append, every_s=0.5, poll_s=0.1)
    assert set(took) == {"slow"}
    assert reports and reports[0].startswith("servers starting, ")
    assert "up none; slow starting (loading weights)" in reports[0]
    dead = ServerProcess(
        "dead",
        ["sh", "-c", "echo bad flag; exit 3"],
        {},
        tmp_path / "dead.log",
        "http://127.0.0.1:9/",
    )
    with dead, pytest.raises(ServerStartError, match="dead exited with code 3") as info:
        wait_all_ready([dead], 60, reports.append, poll_s=0.1)
    assert "bad flag" in str(info.value)
