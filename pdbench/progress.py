"""Follow a submitted job: echo its tasks' ``[pdbench]`` lines with a count of what is
recorded, then return its outcome (task 0's result, or the error and where the logs are)."""

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


def follow(job, recorded: Callable[[], str], poll_s: float = 1.0) -> dict[str, Any]:
    """Print each new ``[pdbench]`` line of every task's log behind the elapsed time and
    ``recorded()`` (e.g. "2/3 points"), until the job ends."""
    offsets: dict[Path, int] = {}
    start = time.monotonic()
    while True:
        finished = job.done()
        stdout = Path(str(job.paths.stdout).replace("%t", "0"))
        for path in sorted(stdout.parent.glob(f"{job.job_id}_*_log.out")) or [stdout]:
            lines, offsets[path] = _new_lines(path, offsets.get(path, 0))
            for line in lines:
                if line.startswith("[pdbench]"):
                    elapsed = time.monotonic() - start
                    print(f"  {elapsed:6.0f}s {recorded()} | {line[10:]}", flush=True)
        if finished:
            break
        time.sleep(poll_s)
    try:
        # A job of several tasks answers one result per task; task 0 did the measuring.
        results = job.results()
        return {"job_id": str(job.job_id), "result": results[0] if results else None}
    except Exception as exc:  # the job failed: say where to look
        print(
            f"[pdbench] job {job.job_id} failed: {type(exc).__name__}: {exc}\n"
            f"  logs: {job.paths.stdout} {job.paths.stderr}",
            flush=True,
        )
        return {"job_id": str(job.job_id), "error": f"{type(exc).__name__}: {exc}"}
