"""SIGTERM or SIGHUP to the driver while it follows its jobs stops them before it exits
(issue 23: a killed ``python -m pdbench`` left a local job and its servers running): a local
job's controller gets SIGTERM (forwarded to its tasks, which stop their servers), a SLURM
job is cancelled, and the driver exits 128 + the signal."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from pdbench.config.schema import ClusterConfig
from pdbench.driver import submit
from pdbench.driver.progress import stop_job
from pdbench.driver.submit import Submitted, stopping_jobs_on

pytestmark = pytest.mark.unit

# A stand-in for submitit's local controller: exits 7 on SIGTERM (what it forwards).
CONTROLLER = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
    "print('up', flush=True); time.sleep(60)"
)


class LocalJob:
    """What the driver holds of a local job: its controller process (``_process``)."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True
        )
        assert self._process.stdout.readline().strip() == "up"
        self.job_id = str(self._process.pid)
        self.cancelled = False

    def done(self, force_check: bool = False) -> bool:
        return self._process.poll() is not None

    def cancel(self, check: bool = True) -> None:  # SIGINT: submitit SIGKILLs tasks 1 s later
        self.cancelled = True


class SlurmJob:
    job_id = "4242"

    def __init__(self) -> None:
        self.cancelled = False

    def done(self, force_check: bool = False) -> bool:
        return self.cancelled

    def cancel(self, check: bool = True) -> None:
        self.cancelled = True


@pytest.fixture
def jobs():
    local, slurm = LocalJob(), SlurmJob()
    yield local, slurm
    if local._process.poll() is None:
        local._process.kill()
    local._process.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_stops_every_job_followed_then_exits(jobs, sig, capsys):
    local, slurm = jobs
    before = signal.getsignal(sig)
    followed = [Submitted("a", local), Submitted("b", slurm)]
    with pytest.raises(SystemExit) as exc, stopping_jobs_on(followed, wait_s=10):
        os.kill(os.getpid(), sig)
        time.sleep(10)  # the handler interrupts this
    assert exc.value.code == 128 + sig
    assert local._process.wait(timeout=5) == 7 and not local.cancelled  # SIGTERM, not SIGINT
    assert slurm.cancelled
    assert signal.getsignal(sig) is before
    out = capsys.readouterr().out
    assert f"[pdbench] {sig.name}: stopping the jobs this launch follows" in out
    assert f"[pdbench] stopping job {local.job_id}: its servers stop" in out
    assert f"[pdbench] job(s) {local.job_id}, 4242 stopped in " in out


def test_follow_stops_its_jobs_when_the_driver_is_killed(jobs, monkeypatch):
    local, slurm = jobs

    def follow_all(followed, recorded, on_finished=None):
        assert followed == [local, slurm]
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)

    monkeypatch.setattr(submit, "follow_all", follow_all)
    with pytest.raises(SystemExit) as exc:
        submit.follow([Submitted("a", local), Submitted("b", slurm)], lambda: "0/1 points")
    assert exc.value.code == 128 + signal.SIGTERM
    assert local.done() and slurm.cancelled


def test_without_a_signal_the_block_runs_and_the_handlers_come_back(jobs):
    local, slurm = jobs
    before = signal.getsignal(signal.SIGTERM)
    with stopping_jobs_on([Submitted("a", local)]):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before and not local.done()


def test_ctrl_c_stops_every_job_followed_then_exits_130(jobs, capsys):
    local, slurm = jobs
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as exc, stopping_jobs_on([Submitted("a", local)], wait_s=10):
        raise KeyboardInterrupt  # what Python raises in the main thread at Ctrl-C
    assert exc.value.code == 128 + signal.SIGINT
    assert local._process.wait(timeout=5) == 7  # the controller got SIGTERM, forwarded
    assert signal.getsignal(signal.SIGINT) is before
    assert "[pdbench] Ctrl-C: stopping the jobs this launch follows" in capsys.readouterr().out


def test_sigint_stops_the_jobs_even_when_the_driver_inherited_it_ignored(jobs, capsys):
    """A driver started from a script in the background (``cmd &``: SIGINT ignored, kept
    so by Python) still stops its jobs on ``kill -INT``."""
    local, slurm = jobs
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(SystemExit) as exc, stopping_jobs_on([Submitted("a", local)], 10):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # the signal interrupts this
        assert exc.value.code == 128 + signal.SIGINT
        assert local._process.wait(timeout=5) == 7
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # as it was inherited
    finally:
        signal.signal(signal.SIGINT, before)


# Stands for a task: SIGINT as it inherited it, SIGTERM ends it with 7.
TASK = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
    "print('up', flush=True); time.sleep(60)"
)


def test_what_starts_deaf_to_ctrl_c_ignores_it_and_still_stops_on_sigterm():
    before = signal.getsignal(signal.SIGINT)
    with submit.deaf_to_ctrl_c():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        proc = subprocess.Popen([sys.executable, "-c", TASK], stdout=subprocess.PIPE, text=True)
    assert signal.getsignal(signal.SIGINT) is before
    try:
        assert proc.stdout.readline().strip() == "up"
        proc.send_signal(signal.SIGINT)  # the terminal's Ctrl-C
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
        proc.send_signal(signal.SIGTERM)  # the driver's stop
        assert proc.wait(timeout=5) == 7
    finally:
        proc.kill()
        proc.wait()


def sleep_until_sigterm(marker: str) -> int:
    """A job's work: say it is up, then wait; SIGTERM ends it (as a pdbench task's does)."""
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
    Path(marker).write_text("up")
    time.sleep(60)
    return 0


def test_a_local_job_does_not_hear_the_terminals_ctrl_c_and_stops_on_the_drivers_word(tmp_path):
    """The real submitit controller: a Ctrl-C that reached it would SIGKILL its task a second
    later (before a pdbench task stopped its servers); it is not heard, and the driver's
    ``stop_job`` ends the job."""
    marker = tmp_path / "up"
    work = [("t", functools.partial(sleep_until_sigterm, str(marker)))]
    (submitted,) = submit.submit(ClusterConfig(), tmp_path / "submitit", 1, "t", work)
    controller = psutil.Process(submitted.job._process.pid)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "the job did not start"
        group = [controller, *controller.children(recursive=True)]
        for proc in group:  # Ctrl-C reaches every process of the terminal's group
            proc.send_signal(signal.SIGINT)
        time.sleep(2.5)
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in group)
        assert not submitted.job.done()
        stop_job(submitted.job)
        deadline = time.monotonic() + 30
        while not submitted.job.done() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert submitted.job.done()
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in [*controller.children(recursive=True), controller]:
                proc.kill()
