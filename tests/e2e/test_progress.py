"""Following several jobs together (an array, a sweep): every job's [pdbench] lines echoed
as they come, each job's outcome, and launch.on_failure=stop cancelling the rest. Real
submitit local jobs (processes), no scheduler."""

from __future__ import annotations

import signal
import sys
import time

import pytest
import submitit

from pdbench.driver.progress import follow_all

pytestmark = pytest.mark.e2e


def says(word: str) -> str:
    print(f"[pdbench] {word}", flush=True)
    return word


def fails() -> None:
    print("[pdbench] about to fail", flush=True)
    raise RuntimeError("boom")


def sleeps() -> str:
    """A task that, as pdbench's own, ends on the SIGTERM a stop sends (submitit's task
    would otherwise log it and go on)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    time.sleep(120)
    return "slept"


def executor(tmp_path):
    ex = submitit.LocalExecutor(folder=tmp_path)
    ex.update_parameters(timeout_min=5)
    return ex


def test_jobs_are_followed_together_and_each_gets_its_outcome(tmp_path, capsys):
    ex = executor(tmp_path)
    jobs = [ex.submit(says, "one"), ex.submit(fails), ex.submit(says, "three")]
    outcomes = follow_all(jobs, lambda: "0/0 points", poll_s=0.1)
    assert [o.result for o in outcomes] == ["one", None, "three"]
    assert "RuntimeError: boom" in outcomes[1].error
    out = capsys.readouterr().out
    for job, line in zip(jobs, ("one", "about to fail", "three"), strict=True):
        assert f"| job {job.job_id} {line}" in out


def test_a_failure_can_cancel_the_jobs_still_running(tmp_path, capsys):
    ex = executor(tmp_path)
    jobs = [ex.submit(fails), ex.submit(sleeps)]
    outcomes = follow_all(jobs, lambda: "", poll_s=0.1, on_finished=lambda i, o: o.failed)
    assert outcomes[0].failed
    assert outcomes[1].result != "slept"  # it did not run to its end
    assert f"cancelled job {jobs[1].job_id}" in capsys.readouterr().out
