"""A value with its 95% interval: how every estimate is written in records and answers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """A value with its 95% interval (``low``/``high`` None: open or unknown on that side)."""

    value: float | None
    low: float | None = None
    high: float | None = None

    def text(self, fmt: str = "{:,.0f}") -> str:
        if self.value is None:
            return "n/a"
        lo = fmt.format(self.low) if self.low is not None else "?"
        hi = fmt.format(self.high) if self.high is not None else "?"
        return f"{fmt.format(self.value)} [{lo}, {hi}]"

    def to_dict(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, d: dict | None) -> Interval:
        d = d or {}
        return cls(d.get("value"), d.get("low"), d.get("high"))
