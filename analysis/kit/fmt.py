"""How numbers are written in the answer, the report and the tables (pure, a leaf)."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

LATER = "turns >= 2"
FLAG_CHARS = 150  # a flag shortened to this many characters (parentheses dropped first)


def pct(value: float | None) -> str:
    return "" if value is None or not np.isfinite(value) else f"{value:+.0%}"


def tokens(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def shorten(text: str, limit: int = FLAG_CHARS) -> str:
    """One line of at most ``limit`` characters; a long one loses its parentheses first."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = " ".join(re.sub(r"\s*\([^()]{6,}\)", "", text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def json_safe(value: Any) -> Any:
    """nan/inf -> None, numpy scalars and enums -> Python, recursively."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
