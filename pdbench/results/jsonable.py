"""Typed values as plain JSON: what records, manifests and launch specs are written from
(and what ids hash, ``pdbench.results.identity.stable_hash``)."""

from __future__ import annotations

from dataclasses import asdict
from enum import Enum
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples -> plain JSON values."""
    if hasattr(obj, "__dataclass_fields__"):
        return {k: to_jsonable(v) for k, v in asdict(obj).items()}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    return obj
