"""Progress while waiting: servers starting (who is up, seconds, last log line), a SLURM job
in the queue (state, reason, place), a job log that starts again after a requeue."""

from __future__ import annotations

import socket
import sys

import pytest

from jobs.serving.server import ServerProcess, ServerStartError, startup_line, wait_all_ready
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
