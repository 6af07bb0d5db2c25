"""A run's files that cannot be written, said in one line: what, where, the space left, the fix.

A full disk mid-run used to end the job in a traceback inside submitit's log. The job now
catches the write's ``OSError`` (``jobs.entry.deployment``), leaves the traceback in its own
log and fails with ``RunFailure``'s one line; the driver shows that line alone
(``pdbench.driver.progress``; the whole trace with ``--debug``). Records already written are
whole (atomic writes), so a rerun into the same dir resumes once there is room.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

WRITE_ERRNOS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
}
FAILURE = "RunFailure"  # the job's exception class name: the driver finds its line by it
# Below this the disk is full for a run: a record, a log line or submitit's result no longer
# fits (a job on a full disk cannot even say why: its log and its result are lost too).
FULL_BYTES = 1 << 20


class RunFailure(Exception):
    """A job's failure said in one line (the traceback stays in the job's log)."""


def _free(path: Path) -> str:
    """``<dir>: 12 MiB free of 2.0 GiB`` for the nearest directory of ``path`` that exists."""
    for parent in (path, *path.parents):
        try:
            usage = shutil.disk_usage(parent)
        except OSError:
            continue
        return f"{parent}: {_size(usage.free)} free of {_size(usage.total)}"
    return f"{path}: free space unknown"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def write_problem(err: OSError, run_dir: str = "") -> str | None:
    """One line for ``err`` when it is a write the disk refused (else None)."""
    why = WRITE_ERRNOS.get(err.errno or -1)
    if why is None:
        return None
    where = Path(str(err.filename)) if err.filename else Path(run_dir or ".")
    fix = (
        "give the run a writable dir (dir=...)"
        if err.errno in (errno.EROFS, errno.EACCES)
        else "free space there or rerun with dir= on a larger disk"
    )
    resume = ""
    if run_dir and (Path(run_dir) / "points").is_dir():
        resume = f"; the records written are whole and a rerun into {run_dir} resumes"
    return f"cannot write {where}: {why} ({_free(where.parent)}); {fix}{resume}"


def full_disk(path: str | Path, run_dir: str = "") -> str | None:
    """One line when the disk holding ``path`` is full (``FULL_BYTES``), else None: what a
    failed job's driver says when the job could not write even its own error."""
    path = Path(path)
    for parent in (path, *path.parents):
        try:
            usage = shutil.disk_usage(parent)
        except OSError:
            continue
        if usage.free >= FULL_BYTES:
            return None
        err = OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_problem(err, run_dir)
    return None
