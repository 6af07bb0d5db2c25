"""Each record file's ``schema_version``: what this code writes, and what it reads.

A record of a newer version than this code knows is refused with the version named (a run
recorded by a newer pdbench); an older one is read through its migration (``MIGRATIONS``:
a function from the older shape to the next); a file without a version is version 1 (request
and trace lines written before they carried one are that version's shape).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

POINT_SCHEMA = 1  # points/<point_id>.json: records.point.PointResult
REQUEST_SCHEMA = 1  # requests/<point_id>.jsonl lines: records.point.RequestRecord
TRACE_SCHEMA = 1  # traces/**/*.jsonl lines: records.trace.TransferTraceRecord
BENCH_SCHEMA = 1  # transfer_bench/<record_id>.json: records.bench.TransferRecord
MANIFEST_SCHEMA = 1  # manifest.json: records.manifest.Manifest

# kind -> {version: the record at that version -> the record at the next}
MIGRATIONS: dict[str, dict[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {}


class SchemaVersionError(ValueError):
    """A record written by a newer pdbench than this one (its version named)."""

    def __init__(self, kind: str, found: Any, known: int, where: str = ""):
        self.kind, self.found, self.known = kind, found, known
        at = f"{where}: " if where else ""
        super().__init__(
            f"{at}a {kind} record of schema_version {found}; this pdbench reads up to "
            f"{known}. Fix: analyse it with the pdbench that recorded it (its manifest's "
            "provenance names the git sha), or upgrade this one"
        )


def current(kind: str, data: dict[str, Any], known: int, where: str = "") -> dict[str, Any]:
    """``data`` (one record of ``kind``) at version ``known``: migrated from an older
    version, refused (``SchemaVersionError``) from a newer or an unreadable one."""
    found = data.get("schema_version", 1)
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        raise SchemaVersionError(kind, found, known, where)
    if found > known:
        raise SchemaVersionError(kind, found, known, where)
    steps = MIGRATIONS.get(kind, {})
    while found < known:
        data = {**steps[found](data), "schema_version": found + 1}
        found += 1
    return data
