"""The range of every numeric setting, declared with the setting (``bounded`` in the schema).

A field declared ``x: int = bounded(4, low=1, high=MANY)`` carries its ``Bounds`` in the
dataclass field's metadata; ``pdbench.validate.bounds`` checks every such field of a
composed config (list fields element by element), and a unit test enumerates every numeric
field of the schema and fails for one declared without bounds. Finite always (no nan, no
inf); ``off`` names the one value outside the range that means "off" or "auto" (0 mostly).
Types are OmegaConf's to check; bounds only judge numbers.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field
from typing import Any

BOUNDS_KEY = "pdbench_bounds"

MANY = 1_000_000  # counts: conversations, Points, sequences
TOKENS = 100_000_000  # lengths in tokens: far past any context
WEEK_S = 7 * 24 * 3600.0  # timeouts
SEED = 2**32 - 1
PORT = 65_535


@dataclass(frozen=True)
class Bounds:
    low: float | None = None  # inclusive, unless ``above``
    high: float | None = None  # inclusive
    above: bool = False  # low is exclusive: > low
    off: float | None = None  # a value allowed besides the range ("off", "auto")

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is out of bounds (None: it is within them, or not a number)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not math.isfinite(value):
            return f"is not a finite number: use {self.describe()}"
        if self.off is not None and value == self.off:
            return None
        low_ok = self.low is None or (value > self.low if self.above else value >= self.low)
        high_ok = self.high is None or value <= self.high
        return None if low_ok and high_ok else f"is out of range: use {self.describe()}"

    def describe(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.above else '>='} {number(self.low)}")
        if self.high is not None:
            parts.append(f"<= {number(self.high)}")
        text = " and ".join(parts) or "a finite number"
        return text + (f" (or {number(self.off)}: off/auto)" if self.off is not None else "")


def number(x: float) -> str:
    """``1,000,000`` and ``0.25``: a reader's numbers, never ``1e+06``."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def bounded(default: Any = MISSING, *, factory: Any = MISSING, **bounds: Any) -> Any:
    """A dataclass field with its ``Bounds`` (``factory``: a list field's default)."""
    meta = {BOUNDS_KEY: Bounds(**bounds)}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def bounds_of(f: Field) -> Bounds | None:
    return f.metadata.get(BOUNDS_KEY)
