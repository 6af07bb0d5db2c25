"""Colours and drawing helpers every plot shares (a leaf: numpy only; each function takes
the matplotlib objects it draws on, so matplotlib is imported by the caller alone)."""

from __future__ import annotations

import numpy as np

FLOW_ORDER = ("agg", "recompute", "pull", "decode_first")
FLOW_COLORS = {
    "agg": "tab:gray",
    "recompute": "tab:red",
    "pull": "tab:blue",
    "decode_first": "tab:green",
}
ROUTE_COLORS = {
    "decode_first": "tab:green",
    "pull": "tab:blue",
    "recompute": "tab:red",
    "recompute_diverged": "tab:orange",
    "recompute_expired": "tab:purple",
}
FLAG_EDGE = "tab:red"
DPI = 110
CI_NOTE = "bars and bands: 95% confidence intervals over the repetitions"


def ordered(flows) -> list[str]:
    """The flows in the usual order (agg, recompute, pull, decode_first), others after."""
    present = list(dict.fromkeys(flows))
    return [f for f in FLOW_ORDER if f in present] + [f for f in present if f not in FLOW_ORDER]


def grid(plt, n: int, cols: int = 2, width: float = 5.4, height: float = 3.6):
    """A figure with ``n`` axes in rows of ``cols`` (the spare ones hidden)."""
    cols = min(cols, max(n, 1))
    rows = -(-max(n, 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def x_scale(ax, xs) -> None:
    """Symlog x when the positive values span more than 30x."""
    pos = [x for x in xs if x > 0]
    if pos and max(pos) / min(pos) > 30:
        ax.set_xscale("symlog", linthresh=min(pos))


def log_y(ax, values, ratio: float = 50) -> bool:
    """Log y when the positive values span more than ``ratio``; True when set."""
    v = [x for x in values if x == x and x > 0]
    if v and max(v) / min(v) > ratio:
        ax.set_yscale("log")
        return True
    return False


def log_x(ax, values, ratio: float = 30) -> bool:
    """Log x when the positive values span more than ``ratio`` (history lengths swept in
    doublings); True when set."""
    v = [x for x in values if x == x and x > 0]
    if v and max(v) / min(v) > ratio:
        ax.set_xscale("log")
        return True
    return False


def symlog_y(ax, values, near: float, ratio: float = 20) -> bool:
    """Symmetric log y, linear within +-``near``, when the values reach more than ``ratio``
    times ``near``: a saving that is a few ms around the crossover and hundreds at the
    longest history shows both. True when set."""
    v = [abs(x) for x in values if x == x]
    near = max(near, 1e-9)
    if v and max(v) > ratio * near:
        ax.set_yscale("symlog", linthresh=near)
        return True
    return False


def crossover_span(ax, c, color="k", label: str | None = "crossover 95% CI") -> None:
    """A crossover's 95% interval as a shaded x span (an open bound: the measured range's
    end); nothing when neither is known."""
    lo = c.low if c.low is not None else c.lo
    hi = c.high if c.high is not None else c.hi
    if lo is not None and hi is not None:
        ax.axvspan(lo, hi, color=color, alpha=0.08, lw=0, label=label)


def errorbars(ax, x, est, low, high, **kw):
    """Points with their 95% intervals (nan bounds: the point alone)."""
    est, low, high = (np.asarray(a, float) for a in (est, low, high))
    lo = np.where(np.isfinite(low), est - low, 0.0)
    hi = np.where(np.isfinite(high), high - est, 0.0)
    kw.setdefault("capsize", 3)
    return ax.errorbar(x, est, yerr=np.vstack([np.maximum(lo, 0), np.maximum(hi, 0)]), **kw)


def band(ax, x, low, high, color, label: str | None = None, alpha: float = 0.18):
    """A shaded 95% band (skipped where the bounds are nan)."""
    low, high = np.asarray(low, float), np.asarray(high, float)
    ok = np.isfinite(low) & np.isfinite(high)
    if ok.any():
        ax.fill_between(
            np.asarray(x)[ok], low[ok], high[ok], color=color, alpha=alpha, lw=0, label=label
        )
