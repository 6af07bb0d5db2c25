"""A value with its 95% interval: how every estimate is written in records and answers."""

from __future__ import annotations

import math

from dataclasses import dataclass


OPEN_BEYOND = 1000  # an upper bound this many times the value says nothing: "no upper bound"


@dataclass(frozen=True)
class Interval:
    """A value with its 95% interval (``low``/``high`` None: open or unknown on that side)."""

    value: float | None
    low: float | None = None
    high: float | None = None

    def text(self, fmt: str = "{:,.0f}") -> str:
        """``92 [51, 127]``; a side the data leave open is said so, never a number no
        reader can use: ``92 [51, no upper bound]`` (a bound past ``OPEN_BEYOND`` times the
        value, or not finite), ``n/a`` without a value."""
        if self.value is None or not math.isfinite(self.value):
            return "n/a"
        lo = fmt.format(self.low) if self.low is not None and math.isfinite(self.low) else "?"
        hi = "no upper bound" if self.open_above() else fmt.format(self.high)
        if lo == "?" and hi == "no upper bound":
            return f"{fmt.format(self.value)} [no interval]"
        return f"{fmt.format(self.value)} [{lo}, {hi}]"

    def open_above(self) -> bool:
        if self.high is None or not math.isfinite(self.high):
            return True
        return abs(self.high) > OPEN_BEYOND * max(abs(self.value), 1.0)

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, d: dict | None) -> Interval:
        d = d or {}
        return cls(d.get("value"), d.get("low"), d.get("high"))
