"""Submit jobs and follow them to their end: the one way every command does (a run's
Deployments, a sweep's runs, the transfer bench, the preflight alone).

``submit`` hands callables to submitit (several at once: one SLURM array) and says each
job's id; ``follow`` echoes the jobs' ``[pdbench]`` lines until all have ended and returns
each one's ``JobOutcome``; a job whose ``stop_after`` says so (``launch.on_failure=stop``)
cancels the others. Ctrl-C, SIGTERM or SIGHUP to this process while it follows (a ``kill``, a
closed terminal, a CI timeout) stops the jobs it follows before it exits
(``stopping_jobs_on``): nothing of the run is left behind.

Locally the driver alone hears Ctrl-C: submitit's local controller, and the tasks it
starts, are started with SIGINT ignored (``deaf_to_ctrl_c``). Were they not, the terminal's
Ctrl-C would reach the controller too, which SIGKILLs its tasks a second later, before they
have stopped their servers (seen on a loaded 2-core host: a P API server left running). The
driver stops them instead with SIGTERM, as for the other signals, and waits.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdbench.config.schema import ClusterConfig
from pdbench.driver.executors import make_executor
from pdbench.driver.progress import JobOutcome, follow_all, stop_job


@dataclass
class Submitted:
    """One submitted job and what it runs."""

    label: str  # a Deployment id, "transfer bench", "preflight"
    job: Any  # the submitit job
    # launch.on_failure: True when this job's outcome ends the run (the others are cancelled)
    stop_after: Callable[[JobOutcome], bool] | None = None


def check_slurm_reachable() -> None:
    """Fail before submitting anything when no SLURM controller answers."""
    if shutil.which("sinfo") is None:
        raise SystemExit(
            "cluster.executor=slurm but there is no `sinfo` here. Fix: run on a SLURM login "
            "node, or start the local test cluster with `scripts/local-slurm.sh start`."
        )
    probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SystemExit(
            f"cluster.executor=slurm but SLURM does not answer ({probe.stderr.strip()}). Fix: "
            "check SLURM_CONF / the controller, or `scripts/local-slurm.sh start` locally."
        )


def submit(
    cluster: ClusterConfig,
    folder: Path,
    nodes: int,
    job_name: str,
    work: list[tuple[str, Callable[[], Any]]],
    sbatch: str = "",
    points: int = 0,
    tasks_per_node: int = 1,
) -> list[Submitted]:
    """Submit each ``(label, callable)`` as a job of ``nodes`` plan nodes (several: one array
    on SLURM). ``sbatch``: the script the launch spec holds, checked against what SLURM got;
    ``points``: the most Points one job measures (how many requeues it may need)."""
    executor = make_executor(cluster, folder, nodes, job_name, points, tasks_per_node)
    with deaf_to_ctrl_c():  # a local job's controller and tasks; sbatch returns at once
        if len(work) == 1:
            jobs = [executor.submit(work[0][1])]
        else:
            with executor.batch():
                jobs = [executor.submit(fn) for _, fn in work]
    if sbatch:
        check_submitted_sbatch(jobs[0], sbatch)
    submitted = [Submitted(label, job) for (label, _), job in zip(work, jobs, strict=True)]
    for s in submitted:
        print(f"[pdbench] submitted {s.label} as job {s.job.job_id}", flush=True)
    return submitted


def follow(submitted: list[Submitted], recorded: Callable[[], str]) -> list[JobOutcome]:
    """Follow the jobs together to their end (``pdbench.driver.progress``); ``recorded()``
    says how far the work is (e.g. "2/6 points"). SIGTERM/SIGHUP meanwhile stops them."""

    def on_finished(i: int, outcome: JobOutcome) -> bool:
        stop = submitted[i].stop_after
        return stop is not None and stop(outcome)

    with stopping_jobs_on(submitted):
        return follow_all([s.job for s in submitted], recorded, on_finished=on_finished)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # caught; Ctrl-C comes as KeyboardInterrupt
STOP_WAIT_S = 120.0  # how long a stopped driver waits for its jobs to stop their servers


@contextmanager
def deaf_to_ctrl_c() -> Iterator[None]:
    """While open, SIGINT is ignored here and in every process started meanwhile: an
    ignored signal stays ignored across ``exec`` and Python keeps it so. A Ctrl-C in that
    moment is lost (submitting a job takes milliseconds to a second)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class DriverSignalled(Exception):
    """SIGTERM or SIGHUP reached the driver while it followed its jobs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def stopping_jobs_on(submitted: list[Submitted], wait_s: float = STOP_WAIT_S) -> Iterator[None]:
    """While in the block, Ctrl-C (``KeyboardInterrupt``), SIGTERM or SIGHUP to this process
    stops every job of ``submitted`` (``stop_jobs``: local and SLURM jobs alike), then exits
    with 128 + the signal (130 after Ctrl-C). ``launch.detach=true`` is how to leave SLURM
    jobs running. Outside the main thread (signals cannot be caught there) the block runs
    as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_signalled(signum, frame):  # noqa: ARG001
        raise DriverSignalled(signum)

    previous = {sig: signal.signal(sig, raise_signalled) for sig in STOP_SIGNALS}
    previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)
    if previous[signal.SIGINT] is signal.SIG_IGN:
        # inherited ignored (a script's `python -m pdbench serve ... &`): Ctrl-C and
        # `kill -INT` still stop the jobs (what was started meanwhile stays deaf to it)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    except (DriverSignalled, KeyboardInterrupt) as got:
        for sig in previous:  # a second signal must not cut the stopping short
            signal.signal(sig, signal.SIG_IGN)
        signum = got.signum if isinstance(got, DriverSignalled) else signal.SIGINT
        name = "Ctrl-C" if signum == signal.SIGINT else str(got)
        print(f"[pdbench] {name}: stopping the jobs this launch follows", flush=True)
        stop_jobs([s.job for s in submitted], wait_s)
        raise SystemExit(128 + signum) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_jobs(jobs: list[Any], wait_s: float = STOP_WAIT_S) -> None:
    """Stop every job not done (``progress.stop_job``) and wait up to ``wait_s`` for them
    to end."""
    running = [job for job in jobs if not job.done()]
    for job in running:
        print(f"[pdbench] stopping job {job.job_id}: its servers stop", flush=True)
        stop_job(job)
    deadline = time.monotonic() + wait_s
    while any(not job.done(force_check=True) for job in running) and time.monotonic() < deadline:
        time.sleep(1.0)  # each check of a SLURM job asks SLURM (executors.SlurmJob.done)
    left = [str(job.job_id) for job in running if not job.done()]
    if left:
        print(f"[pdbench] job(s) {', '.join(left)} still running after {wait_s:.0f} s", flush=True)
    elif running:
        took = time.monotonic() - deadline + wait_s
        ids = ", ".join(str(job.job_id) for job in running)
        print(f"[pdbench] job(s) {ids} stopped in {took:.0f} s", flush=True)


def check_submitted_sbatch(job, planned: str) -> None:
    """Say so loudly if the sbatch file submitit gave SLURM is not the one the spec holds
    (and the dry run printed): a submitit upgrade that changed it, for instance."""
    path = Path(job.paths.submission_file)
    try:
        submitted = path.read_text()
    except OSError:
        return
    if submitted != planned:
        print(
            f"[pdbench] WARNING: the sbatch file SLURM got ({path}) differs from the launch "
            "spec's (what launch.dry_run=true prints); check the submitit version",
            flush=True,
        )
