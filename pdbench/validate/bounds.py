"""Every numeric setting within its declared range (``pdbench.config.bounds``).

The schema's fields carry their bounds; the transfer bench's settings live in the connector
layer (``connector.bench_config``, which imports nothing of the config package), so theirs
are declared here, by dotted name. ``check_bounds`` walks a composed config and returns one
problem per field out of range (a list field: its first bad element); ``validate`` keeps a
field's own rule's message where a rule already refused that field.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

from pdbench.config.axes import axes_of
from pdbench.config.bounds import MANY, SEED, TOKENS, WEEK_S, Bounds, bounds_of
from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import Command, RunConfig

# connector.bench_config.TransferBenchConfig's numeric settings (``bench.*``)
EXTERNAL_BOUNDS: dict[str, Bounds] = {
    "bench.tokens": Bounds(low=1, high=TOKENS),
    "bench.descs_per_block": Bounds(low=1, high=10_000),
    "bench.iterations": Bounds(low=1, high=MANY),
    "bench.warmup": Bounds(low=0, high=MANY),
    "bench.memcpy_iterations": Bounds(low=1, high=MANY),
    "bench.memcpy_min_bytes": Bounds(low=1, high=1e12),
    "bench.flag_ratio": Bounds(low=0, high=1),
    "bench.flag_min_bytes": Bounds(low=0, high=1e12),
    "bench.rendezvous_timeout_s": Bounds(low=0, high=WEEK_S, above=True),
    "bench.step_timeout_s": Bounds(low=0, high=WEEK_S, above=True),
    "bench.seed": Bounds(low=0, high=SEED),
}


def numeric_fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any, Bounds | None]]:
    """(dotted name, value, bounds) of every int/float field (or list of them) under ``obj``."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from numeric_fields(value, f"{name}.")
            continue
        items = value if isinstance(value, list) else [value]
        if (
            items
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in items)
            or not items
            and f.type in ("list[int]", "list[float]")
        ):
            yield name, value, bounds_of(f) or EXTERNAL_BOUNDS.get(name)


def check_bounds(cfg: RunConfig) -> list[ConfigProblem]:
    """Every setting the command reads, within its bounds (``bench.*``: the transfer bench's
    only, as ``check_transfer_bench`` reads them)."""
    out = Problems()
    for name, value, bounds in numeric_fields(cfg):
        if bounds is None:
            continue
        if name.startswith("bench.") and cfg.command is not Command.transfer_bench:
            continue
        for item in value if isinstance(value, list) else [value]:
            why = bounds.problem(item)
            if why:
                out.add(name, item, why, f"{name}={_example(bounds)}")
                break
    return out


def inside(bounds: Bounds) -> float:
    """A value inside ``bounds`` (the fix's example; what other rules see instead)."""
    x = (bounds.low or 0) + (1 if bounds.above else 0)
    if bounds.high is not None and x > bounds.high:
        x = ((bounds.low or 0) + bounds.high) / 2
    return x


def _example(bounds: Bounds) -> str:
    return f"{inside(bounds):g}"


ABSURD = 1000  # past this many times its bound (or 1000), a value is replaced for the rules


def check_duplicates(cfg: RunConfig) -> list[ConfigProblem]:
    """Axis lists name each value once: a value given twice doubled the plan (servers started
    twice for ``flow.kv_recompute_threshold=[0,0]``, Points measured twice)."""
    out = Problems()
    lists = [(n, v) for n, v, _ in numeric_fields(cfg) if isinstance(v, list)]
    lists.append(("flow.flows", [f.value for f in cfg.flow.flows]))
    for name, values in lists:
        if name.startswith("bench.") and cfg.command is not Command.transfer_bench:
            continue
        twice = sorted({v for v in values if values.count(v) > 1}, key=str)
        if twice:
            unique = list(dict.fromkeys(values))
            out.add(
                name,
                values,
                f"names {', '.join(map(str, twice))} more than once",
                f"{name}=[{','.join(map(str, unique))}]",
            )
    return out


# Axes whose empty list means something: no history lengths given, the crossover search.
EMPTY_MEANS = {"workload.history_tokens": "the crossover search"}


def check_axes_given(cfg: RunConfig) -> list[ConfigProblem]:
    """Every sweep axis of a run holds a value (``[]`` measures nothing), but those whose
    empty list means something (``EMPTY_MEANS``)."""
    if cfg.command not in (Command.run, Command.serve, Command.preflight):
        return []
    out = Problems()
    for name in axes_of(RunConfig):
        values = cfg
        for part in name.split("."):
            values = getattr(values, part)
        if not values and name not in EMPTY_MEANS:
            out.add(name, [], "has no value: nothing would be measured", f"{name}=VALUE or [A,B]")
    return out


def _absurd(value: Any, bounds: Bounds) -> bool:
    """Non-finite, or orders of magnitude past its bound: nothing a rule should compute with
    (a share of 1.5 is not: its own rule says what a share is)."""
    if not math.isfinite(value):
        return True
    return bounds.high is not None and value > ABSURD * max(bounds.high, 1)


def within_bounds(cfg: RunConfig, problems: list[ConfigProblem]) -> RunConfig:
    """A copy of ``cfg`` whose non-finite or absurdly large settings (among ``problems``) hold a
    value inside their bounds: what the other rules check, so that none computes with inf or
    10**15 (a plan of 10**15 conversations would never end) while the bound's problem says
    what is wrong. Values too low stay: the rules refuse those with reasons of their own."""
    out = copy.deepcopy(cfg)
    found = {name: bounds for name, _, bounds in numeric_fields(out)}
    for p in problems:
        bounds = found.get(p.field)
        if bounds is None:
            continue
        *path, leaf = p.field.split(".")
        obj = out
        for part in path:
            obj = getattr(obj, part)
        current = getattr(obj, leaf)
        items = current if isinstance(current, list) else [current]
        if not any(_absurd(v, bounds) for v in items):
            continue
        sample = items[0]
        value = inside(bounds)
        value = int(value) if isinstance(sample, int) and float(value).is_integer() else value
        setattr(obj, leaf, [value] if isinstance(current, list) else value)
    return out
