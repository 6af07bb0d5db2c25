"""Records decoded back into their types (``msgspec``): one reader per record kind.

Each reader takes the JSON object (a file's or a line's), brings it to this code's
``schema_version`` (``records.versions.current``: an older version migrated, a newer one
refused naming it) and converts it into its dataclass: a field of the wrong type or a
required field missing raises ``RecordError`` naming the field; fields this code does not
know are ignored (a reader of version N reads what N wrote).
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from records.bench import TransferRecord
from records.manifest import Manifest
from records.point import PointResult, RequestRecord
from records.trace import TransferTraceRecord
from records.versions import (
    BENCH_SCHEMA,
    MANIFEST_SCHEMA,
    POINT_SCHEMA,
    REQUEST_SCHEMA,
    TRACE_SCHEMA,
    SchemaVersionError,
    current,
)

T = TypeVar("T")

__all__ = ["RecordError", "SchemaVersionError"]


class RecordError(ValueError):
    """A record that is not what its type says (a field missing or of the wrong type)."""


def _decode(kind: str, data: Any, cls: type[T], known: int, where: str) -> T:
    if not isinstance(data, dict):
        raise RecordError(f"{where}: a JSON {type(data).__name__}, not a {kind} record")
    data = current(kind, data, known, where)
    try:
        return msgspec.convert(data, type=cls, strict=False)
    except msgspec.ValidationError as err:
        raise RecordError(f"{where}: not a {kind} record: {err}") from err


def point(data: Any, where: str = "") -> PointResult:
    """A ``points/<id>.json`` object as its ``PointResult``."""
    return _decode("point", data, PointResult, POINT_SCHEMA, where)


def request(data: Any, where: str = "") -> RequestRecord:
    """A ``requests/<id>.jsonl`` line's object as its ``RequestRecord``."""
    return _decode("request", data, RequestRecord, REQUEST_SCHEMA, where)


def trace_line(data: Any, where: str = "") -> TransferTraceRecord:
    """A ``traces/**/*.jsonl`` line's object as its ``TransferTraceRecord``."""
    return _decode("trace", data, TransferTraceRecord, TRACE_SCHEMA, where)


def bench_record(data: Any, where: str = "") -> TransferRecord:
    """A ``transfer_bench/<id>.json`` object as its ``TransferRecord``."""
    return _decode("transfer bench", data, TransferRecord, BENCH_SCHEMA, where)


def manifest(data: Any, where: str = "") -> Manifest:
    """A run dir's ``manifest.json`` object as its ``Manifest``."""
    return _decode("manifest", data, Manifest, MANIFEST_SCHEMA, where)
