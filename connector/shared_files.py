"""Files that processes share through a directory: atomic writes and polling for them.

A reader never sees a torn file: every write goes to a temporary file in the same directory
and is renamed into place. Used by the results store, the jobs' rendezvous and the NIXL peers
of the transfer bench (stdlib only: connector imports no pdbench module).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file, flushed to disk, and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """``data`` as indented JSON (anything else as its ``str``), atomically."""
    write_bytes_atomic(path, json.dumps(data, indent=1, default=str).encode())


def write_lines_atomic(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Rows as JSON lines, atomically."""
    write_bytes_atomic(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def poll_until(
    predicate: Callable[[], Any], timeout_s: float, what: str, max_pause_s: float = 0.05
) -> Any:
    """Call ``predicate`` with a growing pause (50 us .. ``max_pause_s``) until it is truthy."""
    deadline = time.monotonic() + timeout_s
    pause = 0.00005
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, max_pause_s)
