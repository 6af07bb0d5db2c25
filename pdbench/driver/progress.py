"""Follow submitted jobs: echo their tasks' ``[pdbench]`` lines with a count of what is
recorded, then return each job's outcome (task 0's result, or the error and where the logs
are). Several jobs (an array, a sweep's submissions) are followed together, side by side.
While a SLURM job waits in the queue (first, or after a requeue), say so: state, reason,
position."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submitit.slurm.slurm import SlurmJob

from pdbench.results.disk import FAILURE, full_disk

QUEUE_POLL_S = 10.0  # how often squeue is asked about a SLURM job
QUEUE_REPEAT_S = 60.0  # an unchanged queue line is printed again after this long
SQUEUE = ["squeue", "-h", "-r", "-o", "%i|%T|%r|%P|%Q"]  # every job, array elements apart


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    if not data and path.exists() and path.stat().st_size < offset:
        return _new_lines(path, 0)  # truncated (a requeued job's log starts again)
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode(errors="replace").splitlines(), offset + cut


def _log_files(job) -> list[Path]:
    stdout = Path(str(job.paths.stdout).replace("%t", "0"))
    return sorted(stdout.parent.glob(f"{job.job_id}_*_log.out")) or [stdout]


DEBUG_ENV = "PDBENCH_DEBUG"  # tracebacks on errors (the CLI's --debug sets it)


@dataclass(frozen=True)
class JobOutcome:
    """How a followed job ended: task 0's result, or why the job failed."""

    job_id: str
    result: Any = None  # task 0's return value (it did the measuring)
    error: str = ""  # "" unless the job failed

    @property
    def failed(self) -> bool:
        return bool(self.error)


def outcome(job) -> JobOutcome:
    """A finished job's result (task 0's: it did the measuring), or its error."""
    try:
        results = job.results()
        return JobOutcome(str(job.job_id), result=results[0] if results else None)
    except Exception as exc:  # the job failed: say where to look
        # the job's own line, or a full disk that left it none (no log, no result)
        said = failure_line(str(exc)) or full_disk(job.paths.folder, run_dir_of(job))
        shown = said if said and not debugging() else f"{type(exc).__name__}: {exc}"
        print(
            f"[pdbench] job {job.job_id} failed: {shown}\n"
            f"  logs: {job.paths.stdout} {job.paths.stderr}",
            flush=True,
        )
        return JobOutcome(str(job.job_id), error=said or f"{type(exc).__name__}: {exc}")


def run_dir_of(job) -> str:
    """The run dir of a job pdbench submitted (its submitit folder is ``<run dir>/submitit``)."""
    folder = Path(job.paths.folder)
    return str(folder.parent) if folder.name == "submitit" else ""


# What a task says when it cannot unpickle the job the driver pickled: it runs another
# pdbench than the driver's (an image built from another checkout, another venv).
OTHER_PDBENCH = (
    "Can't get attribute",
    "No module named 'pdbench",
    "No module named 'jobs",
    "No module named 'records",
    "No module named 'connector",
    "UnpicklingError",
)


def failure_line(trace: str) -> str:
    """The job's own one-line failure (``pdbench.results.disk.RunFailure``) in submitit's
    text of the job's traceback, or what a task that could not load the job means; "" when
    it failed otherwise."""
    for line in reversed(trace.splitlines()):
        _, sep, message = line.partition(f"{FAILURE}: ")
        if sep and message.strip():
            return message.strip()
    found = next((x.strip() for x in trace.splitlines() if any(m in x for m in OTHER_PDBENCH)), "")
    if found:
        return (
            f"the tasks could not load the job this driver pickled ({found[:160]}): they run "
            "another pdbench than this one. Fix: rebuild the image from this checkout (make "
            "image) for cluster.container_image, or point cluster.python at this venv"
        )
    return ""


def debugging() -> bool:
    """``--debug`` or ``PDBENCH_DEBUG=1`` (the CLI sets the variable for the flag)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def queue_line(job_id: str, rows: list[str]) -> str | None:
    """What to say about ``job_id`` from ``squeue -h -r -o %i|%T|%r|%P|%Q`` rows: its state
    and reason while it waits, with its place among the partition's pending jobs (highest
    priority first); None once it runs or is not listed."""
    jobs = [row.split("|") for row in rows if row.count("|") == 4]
    mine = next((j for j in jobs if j[0] == job_id), None)
    if mine is None or mine[1] not in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING"):
        return None
    _, state, reason, partition, _ = mine
    text = f"job {job_id} {state}" + (f" ({reason})" if reason and reason != "None" else "")
    if state == "PENDING":
        pending = [j for j in jobs if j[1] == "PENDING" and j[3] == partition]

        def priority(j: list[str]) -> int:
            return int(j[4]) if j[4].isdigit() else 0

        pending.sort(key=lambda j: -priority(j))
        place = [j[0] for j in pending].index(job_id) + 1
        text += f", {_ordinal(place)} of {len(pending)} pending in partition {partition}"
    return text


def left_the_queue(job_ids: set[str], rows: list[str]) -> set[str]:
    """The jobs of ``job_ids`` that ``squeue`` rows (``%i|...``) no longer list: ended (squeue
    lists pending, running and completing jobs only)."""
    listed = {row.split("|", 1)[0] for row in rows if "|" in row}
    return {job_id for job_id in job_ids if job_id not in listed}


class QueueWatch:
    """Asks squeue about the followed SLURM jobs, once every QUEUE_POLL_S for all of them (one
    query of the queue, not one per job); ``poll`` returns a line per job that waits in the
    queue and whose line changed (or QUEUE_REPEAT_S went by), and keeps in ``gone`` the jobs
    the queue no longer lists, so that a job that ended without a result (``scancel``, a
    node failure) is looked at now rather than at submitit's next state query (up to a
    minute later)."""

    def __init__(self, job_ids: list[str]) -> None:
        self.job_ids = job_ids
        self.next_poll = 0.0
        self.said: dict[str, tuple[str, float]] = {}
        self.squeue = shutil.which("squeue") is not None
        self.gone: set[str] = set()

    def poll(self, waiting: set[str]) -> list[str]:
        """``waiting``: the ids of the followed jobs not seen ended (local ones are skipped)."""
        now = time.monotonic()
        self.gone = set()
        waiting = waiting & set(self.job_ids)
        if not self.squeue or not waiting or now < self.next_poll:
            return []
        self.next_poll = now + QUEUE_POLL_S
        try:
            done = subprocess.run(SQUEUE, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return []
        if done.returncode != 0:
            return []
        rows = done.stdout.splitlines()
        self.gone = left_the_queue(waiting, rows)
        lines = []
        for job_id in self.job_ids:
            line = queue_line(job_id, rows) if job_id in waiting else None
            said, at = self.said.get(job_id, ("", 0.0))
            if line is None or (line == said and now - at < QUEUE_REPEAT_S):
                continue
            self.said[job_id] = (line, now)
            lines.append(line)
        return lines


def follow_all(
    jobs: list,
    recorded: Callable[[], str],
    poll_s: float = 1.0,
    on_finished: Callable[[int, JobOutcome], bool] | None = None,
) -> list[JobOutcome]:
    """Print each new ``[pdbench]`` line of every task of every job behind the elapsed time,
    ``recorded()`` (e.g. "2/3 points") and, with several jobs, the job's id; return every
    job's ``outcome`` once all have ended. ``on_finished(i, outcome)`` returning True
    cancels the jobs still running (``launch.on_failure=stop``)."""
    offsets: dict[Path, int] = {}
    outcomes: list[JobOutcome | None] = [None] * len(jobs)
    queue = QueueWatch([str(j.job_id) for j in jobs if isinstance(j, SlurmJob)])
    start = time.monotonic()
    while True:
        count = ""  # recorded() reads the run dir: once per tick, when something is printed

        def say(text: str) -> None:
            nonlocal count
            count = count or recorded()
            print(f"  {time.monotonic() - start:6.0f}s {count} | {text}", flush=True)

        done = {i: job.done() for i, job in enumerate(jobs) if outcomes[i] is None}
        for line in queue.poll({str(jobs[i].job_id) for i, ended in done.items() if not ended}):
            say(line)
        for i in done:
            if str(jobs[i].job_id) in queue.gone:  # SLURM's word, not submitit's cached one
                done[i] = jobs[i].done(force_check=True)
        for i, finished in done.items():
            job = jobs[i]
            who = f"job {job.job_id} " if len(jobs) > 1 else ""
            for path in _log_files(job):
                lines, offsets[path] = _new_lines(path, offsets.get(path, 0))
                for line in lines:
                    if line.startswith("[pdbench]"):
                        say(f"{who}{line[10:]}")
            if finished:
                ended = outcomes[i] = outcome(job)
                if on_finished is not None and on_finished(i, ended):
                    _cancel_rest(jobs, outcomes)
        if all(o is not None for o in outcomes):
            return [o for o in outcomes if o is not None]
        time.sleep(poll_s)


def _cancel_rest(jobs: list, outcomes: list) -> None:
    for job, done in zip(jobs, outcomes, strict=True):
        if done is None and not job.done():
            stop_job(job)
            print(f"[pdbench] launch.on_failure=stop: cancelled job {job.job_id}", flush=True)


def stop_job(job: Any) -> None:
    """Ask a job to end. A local job's controller gets SIGTERM, which it forwards to its
    tasks: a pdbench task tears down its servers and exits (submitit's ``cancel`` sends
    SIGINT instead, which a driver started in the background passes on as ignored, so the
    job ran on; and where it is heard the controller SIGKILLs the tasks a second later,
    before their servers, in sessions of their own, are stopped). A SLURM job is cancelled
    (scancel: SIGTERM to every task)."""
    process = getattr(job, "_process", None)  # submitit's LocalJob, in its submitter
    if process is None:
        job.cancel(check=False)
        return
    try:
        process.send_signal(signal.SIGTERM)
    except OSError:
        pass


def follow(job, recorded: Callable[[], str], poll_s: float = 1.0) -> JobOutcome:
    """``follow_all`` of one job."""
    return follow_all([job], recorded, poll_s)[0]
