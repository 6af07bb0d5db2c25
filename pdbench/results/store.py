"""The results store: run manifest, one PointResult file per Point, raw request records.

Layout of a run directory::

    <run.dir>/manifest.json                 composed config + provenance
    <run.dir>/points/<point_id>.json        one PointResult, written atomically
    <run.dir>/requests/<point_id>.jsonl     one RequestRecord per line
    <run.dir>/logs/<deployment_id>/...      server, router and job logs
    <run.dir>/launch/<deployment_id>.json   the launch spec the job ran (pdbench.spec.launch)
    <run.dir>/traces/<deployment_id>/*.jsonl  per-transfer traces (connector.trace=true)
    <run.dir>/preflight/<deployment_id>.json  every node's preflight report (jobs/preflight/job.py)

Every write goes to a temporary file in the same directory and is renamed into place, so
a crash leaves the old file or the new one, never a torn one. Analysis reads only these.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from connector.shared_files import write_json_atomic, write_lines_atomic
from records import read
from records.point import (
    TTFT_SPLIT_PARTS,
    PointResult,
    PointStatus,
    RequestRecord,
)
from records.manifest import Manifest
from records.read import RecordError, SchemaVersionError

__all__ = ["write_json_atomic", "write_lines_atomic"]  # with the store: writers of run files

# Run dirs this process launches into, with their open lock files (held until it exits).
_CLAIMED: dict[str, Any] = {}


class CorruptRecord(ValueError):
    """A record file that is not the JSON object it should be (truncated, overwritten)."""

    def __init__(self, path: Path, reason: str):
        self.path = path
        super().__init__(f"{path}: corrupt record ({reason})")


def read_record(path: Path) -> dict[str, Any]:
    """One JSON record file; ``CorruptRecord`` naming the file when it does not parse."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptRecord(path, str(err)) from err
    if not isinstance(record, dict):
        raise CorruptRecord(path, f"a JSON {type(record).__name__}, not an object")
    return record


def point_record(path: Path) -> PointResult:
    """One ``points/<id>.json`` as its PointResult; ``CorruptRecord`` naming the file when it
    does not parse or is not one (``SchemaVersionError``: a newer pdbench wrote it)."""
    data = read_record(path)
    try:
        return read.point(data, str(path))
    except RecordError as err:
        raise CorruptRecord(path, str(err).removeprefix(f"{path}: ")) from err


# What a run writes under its dir (besides manifest.json): where nothing else may write
# (``python -m analysis --out`` is refused there: its files would be read back as records)
RUN_FOLDERS = frozenset(
    {
        "points",
        "requests",
        "logs",
        "launch",
        "traces",
        "timing",
        "warmup",
        "search",
        "serve",
        "submitit",
        "rendezvous",
        "transfer_bench",
        "preflight",
    }
)


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    @property
    def points_dir(self) -> Path:
        return self.root / "points"

    def point_path(self, point_id: str) -> Path:
        return self.points_dir / f"{point_id}.json"

    def requests_path(self, point_id: str) -> Path:
        return self.root / "requests" / f"{point_id}.jsonl"

    def logs_dir(self, deployment_id: str) -> Path:
        return self.root / "logs" / deployment_id

    def launch_spec_path(self, deployment_id: str) -> Path:
        """The launch spec a Deployment's job ran, addresses resolved (``launch_spec``)."""
        return self.root / "launch" / f"{deployment_id}.json"

    def traces_dir(self, point_id: str) -> Path:
        return self.root / "traces" / point_id

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.manifest_path, manifest)

    def read_manifest(self) -> dict[str, Any]:
        """The manifest's JSON, for the code that writes it (``update_manifest``)."""
        return read_record(self.manifest_path)

    def manifest(self) -> Manifest:
        """The manifest typed (``records.read.manifest``): ``CorruptRecord`` when it does not
        parse or is not a manifest, ``SchemaVersionError`` when a newer pdbench wrote it."""
        return typed_manifest(self.read_manifest(), self.manifest_path)

    def previous_manifest(self, set_aside: bool) -> tuple[dict[str, Any], str]:
        """The dir's manifest (``{}`` for a new dir) and, when it does not parse, what became
        of it: set aside (``set_aside``; the launch then starts a new history, as a corrupt
        Point is measured again) or, for a dry run, what a launch would do with it."""
        if not self.manifest_path.exists():
            return {}, ""
        try:
            return self.read_manifest(), ""
        except CorruptRecord as err:
            if not set_aside:
                return {}, (
                    f"{err}: a launch sets it aside and starts a new history (its launches and "
                    "jobs are lost; its Points recorded ok are still skipped)"
                )
            aside = self.set_aside(self.manifest_path)
            return {}, (
                f"{err}: set aside as {aside.name}; this launch starts a new history (the old "
                "launches and jobs are in that file; Points recorded ok are still skipped)"
            )

    def set_aside(self, path: Path) -> Path:
        """Rename a corrupt record to ``<stem>.corrupt-<time><suffix>`` beside it: kept for
        a reader, out of the way of a new one."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.stem}.corrupt-{stamp}{path.suffix}")
        n = 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.stem}.corrupt-{stamp}-{n}{path.suffix}")
        path.rename(aside)
        return aside

    @contextmanager
    def _manifest_lock(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".manifest.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def held_by(self) -> str | None:
        """Who holds the dir's launch lock now (None: nobody), without taking it."""
        path = self.root / ".launch.lock"
        if not path.exists():
            return None
        with open(path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                return lock.read().strip() or "another process"
            fcntl.flock(lock, fcntl.LOCK_UN)
        return None

    def claim(self) -> str | None:
        """Hold the dir's launch lock until this process ends; None once held, else who holds
        it. Two launches following jobs into one dir at once would start servers on the same
        ports and write the same records. The jobs of one ``-m`` sweep run in one process:
        a dir it already holds is its own."""
        key = str(self.root.resolve())
        if key in _CLAIMED:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / ".launch.lock", "a+")  # noqa: SIM115 - held past this call
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            return holder
        lock.seek(0)
        lock.truncate()
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n")
        lock.flush()
        _CLAIMED[key] = lock
        return None

    def update_manifest(self, mutate: Callable[[dict[str, Any]], None]) -> str:
        """Read, change and write the manifest under a lock: the driver (jobs it submitted)
        and the jobs (their nodes' preflight findings) both add to it. One that does not
        parse is set aside (``set_aside``) and a new one begun, so that nothing fails on
        it; returns what was set aside ('' when nothing was)."""
        with self._manifest_lock():
            manifest, note = self.previous_manifest(set_aside=True)
            mutate(manifest)
            self.write_manifest(manifest)
        return note

    def write_point(self, result: PointResult, requests: list[RequestRecord]) -> None:
        """Write the request records first, then the PointResult that points at them."""
        req_path = self.requests_path(result.point_id)
        write_lines_atomic(req_path, [asdict(r) for r in requests])
        result.requests_file = str(req_path.relative_to(self.root))
        write_json_atomic(self.point_path(result.point_id), result.to_dict())

    def read_point(self, point_id: str) -> PointResult | None:
        """The Point's record (None: none yet); ``CorruptRecord`` when it does not parse or
        is not a PointResult, ``SchemaVersionError`` when a newer pdbench wrote it."""
        path = self.point_path(point_id)
        if not path.exists():
            return None
        return point_record(path)

    def has_record(self, point_id: str) -> bool:
        """Whether the Point has a record (ok, failed or corrupt): not ``pending``, without
        reading it (progress counts run every tick)."""
        return self.point_path(point_id).exists()

    def point_status(self, point_id: str) -> PointStatus:
        """``ok``, ``failed``, ``corrupt`` (unreadable: measured again) or ``pending``."""
        try:
            record = self.read_point(point_id)
        except CorruptRecord:
            return PointStatus.corrupt
        if record is None:
            return PointStatus.pending
        return PointStatus.ok if record.status == PointStatus.ok else PointStatus.failed

    def iter_points(self) -> list[PointResult]:
        """Every Point's record in the dir; ``CorruptRecord`` at the first that is not one."""
        if not self.points_dir.exists():
            return []
        return [point_record(p) for p in sorted(self.points_dir.glob("*.json"))]

    def read_requests(self, point_id: str) -> list[RequestRecord]:
        """The Point's request records (none: no file)."""
        path = self.requests_path(point_id)
        if not path.exists():
            return []
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        return [read.request(json.loads(line), str(path)) for line in lines]


def typed_manifest(data: dict[str, Any], path: Path) -> Manifest:
    """A manifest's JSON as its ``Manifest`` ({}: a dir with none yet); one that is not a
    manifest is ``CorruptRecord``, a newer one ``SchemaVersionError``."""
    if not data:
        return Manifest()
    try:
        return read.manifest(data, str(path))
    except SchemaVersionError:
        raise
    except RecordError as err:
        raise CorruptRecord(path, str(err)) from err
