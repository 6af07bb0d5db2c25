"""Follow submitted jobs: echo their tasks' ``[pdbench]`` lines with a count of what is
recorded, then return each job's outcome (task 0's result, or the error and where the logs
are). Several jobs (an array, a sweep's submissions) are followed together, side by side."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    cut = data.rfind(b"\n") + 1
    return data[:cut].decode(errors="replace").splitlines(), offset + cut


def _log_files(job) -> list[Path]:
    stdout = Path(str(job.paths.stdout).replace("%t", "0"))
    return sorted(stdout.parent.glob(f"{job.job_id}_*_log.out")) or [stdout]


def outcome(job) -> dict[str, Any]:
    """A finished job's result (task 0's: it did the measuring), or its error."""
    try:
        results = job.results()
        return {"job_id": str(job.job_id), "result": results[0] if results else None}
    except Exception as exc:  # the job failed: say where to look
        print(
            f"[pdbench] job {job.job_id} failed: {type(exc).__name__}: {exc}\n"
            f"  logs: {job.paths.stdout} {job.paths.stderr}",
            flush=True,
        )
        return {"job_id": str(job.job_id), "error": f"{type(exc).__name__}: {exc}"}


def follow_all(
    jobs: list,
    recorded: Callable[[], str],
    poll_s: float = 1.0,
    on_finished: Callable[[int, dict[str, Any]], bool] | None = None,
) -> list[dict[str, Any]]:
    """Print each new ``[pdbench]`` line of every task of every job behind the elapsed time,
    ``recorded()`` (e.g. "2/3 points") and, with several jobs, the job's id; return every
    job's ``outcome`` once all have ended. ``on_finished(i, outcome)`` returning True
    cancels the jobs still running (``launch.on_failure=stop``)."""
    offsets: dict[Path, int] = {}
    outcomes: list[dict[str, Any] | None] = [None] * len(jobs)
    start = time.monotonic()
    while True:
        for i, job in enumerate(jobs):
            if outcomes[i] is not None:
                continue
            finished = job.done()
            for path in _log_files(job):
                lines, offsets[path] = _new_lines(path, offsets.get(path, 0))
                for line in lines:
                    if line.startswith("[pdbench]"):
                        elapsed = time.monotonic() - start
                        who = f"job {job.job_id} " if len(jobs) > 1 else ""
                        print(f"  {elapsed:6.0f}s {recorded()} | {who}{line[10:]}", flush=True)
            if finished:
                outcomes[i] = outcome(job)
                if on_finished is not None and on_finished(i, outcomes[i]):
                    _cancel_rest(jobs, outcomes)
        if all(o is not None for o in outcomes):
            return [o for o in outcomes if o is not None]
        time.sleep(poll_s)


def _cancel_rest(jobs: list, outcomes: list) -> None:
    for job, done in zip(jobs, outcomes, strict=True):
        if done is None and not job.done():
            job.cancel(check=False)
            print(f"[pdbench] launch.on_failure=stop: cancelled job {job.job_id}", flush=True)


def follow(job, recorded: Callable[[], str], poll_s: float = 1.0) -> dict[str, Any]:
    """``follow_all`` of one job."""
    return follow_all([job], recorded, poll_s)[0]
