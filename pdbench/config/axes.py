"""Sweep axes: the settings that take a value or a list of values, declared in the schema.

A field declared ``x: list[int] = axis(Level.point, [4], low=1, high=MANY)`` is an axis: its
list holds every value measured (a single value is a list of one: ``workload.concurrency=4``
on the command line reads as ``[4]``, ``pdbench.config.overrides.as_lists``). There is no
second field for "the values": nothing given can be dropped for another.

Two levels (``pdbench.plan.sweep`` expands them once):

- ``deployment``: each value its own servers (``flow.kv_recompute_threshold``, the TTL);
- ``point``: servers stay up, each value its own Points (flows, history lengths, working
  set, load).

A value given twice would measure the same thing twice: refused (``pdbench.validate.rules``).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field
from enum import StrEnum
from typing import Any

from pdbench.config.bounds import BOUNDS_KEY, Bounds

AXIS_KEY = "pdbench_axis"


class Level(StrEnum):
    """What a value of an axis gets of its own."""

    deployment = "deployment"  # its own servers
    point = "point"  # its own Points on the same servers


def axis(level: Level, values: list[Any], **bounds: Any) -> Any:
    """A list field that is a sweep axis of ``level``, defaulting to ``values``, each value
    within ``bounds`` (``pdbench.config.bounds``)."""
    meta = {AXIS_KEY: level, BOUNDS_KEY: Bounds(**bounds)}
    return field(default_factory=lambda: list(values), metadata=meta)


def axes_of(cls: type, prefix: str = "") -> dict[str, Level]:
    """Dotted key -> level of every axis under the dataclass ``cls`` (the schema's root)."""
    out: dict[str, Level] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if AXIS_KEY in f.metadata:
            out[path] = f.metadata[AXIS_KEY]
        elif dataclasses.is_dataclass(hints.get(f.name)):
            out.update(axes_of(hints[f.name], f"{path}."))
    return out
