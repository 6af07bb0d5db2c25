"""Files that processes share through a directory: atomic writes, polling, a rendezvous.

A reader never sees a torn file: every write goes to a temporary file in the same directory
and is renamed into place. ``Rendezvous`` is the one way tasks of a job meet through files:
the deployment job's nodes (``jobs.run.rendezvous``), the preflight's cross-node checks and
the transfer bench's NIXL peers. The results store writes its records with these writes too
(stdlib only: connector imports no pdbench module).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file, flushed to disk, and a rename. An
    ``OSError`` names ``path`` (a full disk fails the flush, where Python names no file)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as err:
        raise OSError(err.errno, err.strerror, str(path)) from err
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename != str(path):
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
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


class PeerFailed(RuntimeError):
    """A task published its failure (``Rendezvous.publish_failure``) instead of what was
    waited for; the message is its error."""


@dataclass(frozen=True)
class Rendezvous:
    """A directory every task of one job sees (the run dir, on the cluster's shared
    filesystem): each task publishes files there, atomically, and waits for the others'
    with a deadline. A task that cannot come publishes ``<its name>.failed``: whoever waits
    for it stops at once with its error (``PeerFailed``) instead of waiting out the deadline.

    The caller picks the file names; the directory is made on first use."""

    directory: Path

    def path(self, name: str) -> Path:
        return Path(self.directory) / name

    def publish(self, name: str, data: bytes | str) -> Path:
        """Write file ``name`` (atomically); its path."""
        path = self.path(name)
        write_bytes_atomic(path, data.encode() if isinstance(data, str) else data)
        return path

    def publish_json(self, name: str, record: Any) -> Path:
        return self.publish(name, json.dumps(record, sort_keys=True, default=str))

    def publish_failure(self, who: str, error: str) -> Path:
        """Tell those waiting for ``who`` that it will not come, and why."""
        return self.publish(f"{who}.failed", error)

    def failure(self, who: str) -> str | None:
        """``who``'s published error, None when it published none."""
        try:
            return self.path(f"{who}.failed").read_text(errors="replace")
        except OSError:
            return None

    def read(self, name: str) -> bytes | None:
        try:
            return self.path(name).read_bytes()
        except OSError:
            return None

    def read_json(self, name: str) -> Any:
        """File ``name`` as JSON, None while it is not there (or not JSON)."""
        data = self.read(name)
        try:
            return None if data is None else json.loads(data)
        except ValueError:
            return None

    def gather(
        self,
        names: Iterable[str],
        timeout_s: float,
        *,
        failures: Iterable[str] = (),
        parse: Callable[[str], Any] | None = None,
        max_pause_s: float = 0.2,
    ) -> tuple[dict[str, Any], list[str]]:
        """Files ``names`` as they appear: ``(found, missing)`` once all are there or after
        ``timeout_s``. ``parse`` reads each (default: JSON; a file it cannot read counts as
        not there yet); ``PeerFailed`` as soon as one of ``failures`` published its error."""
        names, failures = list(names), list(failures)
        read = parse or self.read_json
        found: dict[str, Any] = {}

        def all_there() -> bool:
            for who in failures:
                error = self.failure(who)
                if error is not None:
                    raise PeerFailed(f"{who}: {error}")
            for name in names:
                if name not in found:
                    value = read(name)
                    if value is not None:
                        found[name] = value
            return len(found) == len(names)

        try:
            poll_until(all_there, timeout_s, "", max_pause_s=max_pause_s)
        except TimeoutError:
            pass
        return {n: found[n] for n in names if n in found}, [n for n in names if n not in found]

    def wait(
        self,
        names: Iterable[str],
        timeout_s: float,
        what: str,
        *,
        failures: Iterable[str] = (),
        parse: Callable[[str], Any] | None = None,
        max_pause_s: float = 0.2,
    ) -> dict[str, Any]:
        """``gather``, every one of ``names`` or ``TimeoutError`` naming those missing."""
        found, missing = self.gather(
            names, timeout_s, failures=failures, parse=parse, max_pause_s=max_pause_s
        )
        if missing:
            raise TimeoutError(
                f"timed out after {timeout_s:.0f} s waiting for {what}: no {', '.join(missing)} "
                f"in {self.directory}"
            )
        return found
