"""The crossover with its 95% interval, from every history length at once (pure numpy).

The saving ``s(h) = TTFT(recompute) - TTFT(pull)`` of a turn with ``h`` history tokens has
a known shape: recomputing ``h`` tokens costs ``c1 h + c2 h^2`` (matmuls, attention),
pulling them ``alpha + h bytes/beta``, everything else is common to both flows. So

    s(h) = -alpha + b h + c h^2

is fitted (weighted least squares) to the mean paired saving of every wave (a turn of a
repetition), linear when only two distinct lengths were measured. Why a fit and not the
old interpolation between cell means: interpolation uses two noisy cells around the last
sign change and flips with noise (three identical runs gave 576, 32 and 64 tokens); the fit
uses every length, with the physically expected shape, so the noise of one cell moves it
little. Weights: ``1 / level^2``, ``level`` the mean TTFT of both flows at that (history
length, turn) over its repetitions (the noise is multiplicative: a 2 s TTFT is noisier in
ms than a 50 ms one). The weights are estimated from the same runs and then taken as
given: for given weights the fitted value at any ``h`` is linear in the wave means, and the
band leaves out the weights' own spread (small: each level averages both flows and every
repetition of its length; the calibration test measures the band's coverage with it).

The band of ``s(h)`` is ``stats.linear_interval`` of the clusters' contributions (the
stratified Rao-Wu bootstrap's closed form, Student-t with Satterthwaite df). It is
**pointwise**: at each length it holds the true saving with 95%, not the whole curve at once
(on synthetic runs the whole true curve lies inside it in well under 95% of them). The
fitted shape pools every length: a cell whose own interval says recompute is faster can lie
inside the crossover's interval (``pull_recompute.Measured.disagreements`` names them).
The crossover's interval is the set of lengths where the band holds 0 (test inversion, as Fieller's
interval: a length lies outside it only where the data say ``s(h) != 0`` at 95%), widened by
one grid step each way (``band_grid``: ``GRID`` even steps over the measured range, and as
many log-spaced ones where it spans more than two decades, as when a search measures 16 to
16,000 tokens: even steps of 67 tokens would not resolve a crossover near the short end).
It covers the true crossover whenever the band covers ``s`` there, so at least as often as
the band's own 95%. It is looked for over the measured lengths
only: an interval that reaches either end "leaves the measured range" (inconclusive).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from analysis.method.stats import (
    MAX_REPETITIONS,
    Status,
    linear_interval,
    repetitions_to_decide,
)

GRID = 241  # points of the band over the measured range
SEARCH = 4.0  # the fitted curve's root is looked for up to SEARCH x the longest length
SPAN = 100.0  # a measured range wider than this ratio gets log-spaced grid points too
# "As fast": where the band holds 0 but its bound on the slower side stays within this share
# of the flows' mean TTFT there, neither flow is slower by more than that (an equivalence
# margin, said in the answer). It decides a range's undecided end: pull (recompute) is as
# fast or faster at the shortest (longest) lengths, so no crossover lies beyond that end.
EQUIVALENCE_SHARE = 0.05


class Shape(StrEnum):
    CROSSING = "crossing"  # recompute faster below, pull faster above
    FALLING = "pull_faster_below"  # pull faster below, recompute faster above
    MIXED = "changes_sign_more_than_once"
    PULL_EVERYWHERE = "pull_faster_everywhere"  # at every measured length
    RECOMPUTE_EVERYWHERE = "recompute_faster_everywhere"
    NO_DATA = "no_data"


@dataclass(frozen=True)
class SavingCurve:
    """``s(h)`` fitted, in ms, with its 95% band over the measured range ``grid``."""

    coef: np.ndarray  # polynomial in h / scale, lowest order first
    scale: float
    grid: np.ndarray
    fit: np.ndarray
    low: np.ndarray
    high: np.ndarray
    se: np.ndarray
    df: np.ndarray
    undetermined: bool  # a history length with one repetition: no band
    repetitions: int  # the fewest of any history length
    requests: int  # paired requests behind it
    waves: int
    level: np.ndarray | None = None  # the flows' mean TTFT (ms) along ``grid``: the margin's scale

    @property
    def degree(self) -> int:
        return len(self.coef) - 1

    @property
    def x_min(self) -> float:
        return float(self.grid[0])

    @property
    def x_max(self) -> float:
        return float(self.grid[-1])

    def at(self, h: np.ndarray | float) -> np.ndarray:
        u = np.asarray(h, float) / self.scale
        return sum(c * u**k for k, c in enumerate(self.coef))

    def alpha_ms(self) -> float:
        """The fitted saving at ``h = 0`` with its sign flipped (the pull's fixed cost)."""
        return -float(self.coef[0])

    def root(self) -> float | None:
        """Where the fitted curve first turns from negative to positive, 0 .. SEARCH x max."""
        up = [h for h, rising in self.roots() if rising]
        return up[0] if up else None

    def roots(self, lo: float = 0.0, hi: float | None = None) -> list[tuple[float, bool]]:
        """Every sign change of the fitted curve in ``lo .. hi`` (default 0 .. SEARCH x the
        longest length): (tokens, rising), rising when it turns from <= 0 to > 0."""
        hi = SEARCH * self.x_max if hi is None else hi
        h = np.linspace(lo, hi, 4001)
        s = self.at(h)
        out = []
        for i in np.nonzero((s[:-1] <= 0) != (s[1:] <= 0))[0]:
            a, b = float(h[i]), float(h[i + 1])
            rising = bool(s[i] <= 0)
            for _ in range(60):
                mid = 0.5 * (a + b)
                if (self.at(mid) <= 0) == rising:
                    a = mid
                else:
                    b = mid
            out.append((b, rising))
        return out


def band_grid(lo: float, hi: float, points: int = GRID, floor: float | None = None) -> np.ndarray:
    """``points`` even steps over ``lo .. hi``, and ``points`` log-spaced ones where it spans
    more than two decades (``hi > SPAN x lo``; narrower ranges: even steps alone, as always).
    A range from 0 (a search's first length: no history) is log-spaced from ``floor``, the
    shortest positive length measured: even steps of a 0-100,000 range are 417 tokens wide,
    and a crossover at 20 tokens would get an interval of [0, 417] whatever the data."""
    even = np.linspace(lo, hi, points)
    start = lo if lo > 0 else floor
    if start is None or start <= 0 or hi <= SPAN * start:
        return even
    return np.union1d(even, np.geomspace(start, hi, points))


def fit_curve(
    x: np.ndarray,
    y: np.ndarray,
    weight: np.ndarray,
    cluster: np.ndarray,
    strata: np.ndarray,
    requests: int | None = None,
    grid_points: int = GRID,
) -> SavingCurve | None:
    """Weighted polynomial fit of wave means ``y`` at ``x``; None with < 2 distinct lengths.

    ``cluster``: (n,) cluster (repetition) id of each wave, 0 .. G-1; ``strata``: (G,)
    stratum (history length) of each cluster."""
    x, y, w = (np.asarray(a, float) for a in (x, y, weight))
    cluster, strata = np.asarray(cluster, int), np.asarray(strata, int)
    keep = np.isfinite(x) & np.isfinite(y) & np.isfinite(w) & (w > 0)
    x, y, w, cluster = x[keep], y[keep], w[keep], cluster[keep]
    distinct = len(np.unique(np.round(x)))
    if distinct < 2:
        return None
    degree = 2 if distinct >= 3 else 1
    scale = float(np.max(np.abs(x))) or 1.0
    u = x / scale
    design = np.column_stack([u**k for k in range(degree + 1)])
    a = (design * w[:, None]).T @ design
    try:
        a_inv = np.linalg.inv(a)
    except np.linalg.LinAlgError:
        return None
    positive = x[x > 0]
    floor = float(positive.min()) if len(positive) else None
    grid = band_grid(float(x.min()), float(x.max()), grid_points, floor)
    g = np.column_stack([(grid / scale) ** k for k in range(degree + 1)])
    per_cluster = np.zeros((len(strata), degree + 1))
    np.add.at(per_cluster, cluster, design * (w * y)[:, None])
    contrib = per_cluster @ (g @ a_inv).T  # (G, K): cluster g's share of s(grid)
    spread = linear_interval(contrib, strata)
    low, high = spread.bounds()
    coef = a_inv @ per_cluster.sum(axis=0)
    sizes = np.bincount(strata)
    levels = 1.0 / np.sqrt(w)  # the weights are 1 / level^2
    at = np.unique(np.round(x))
    by_length = [float(levels[np.round(x) == v].mean()) for v in at]
    return SavingCurve(
        coef=coef,
        scale=scale,
        grid=grid,
        fit=spread.estimate,
        low=low,
        high=high,
        se=spread.se,
        df=spread.df,
        undetermined=bool(spread.undetermined.any()),
        repetitions=int(sizes[sizes > 0].min()),
        requests=int(requests if requests is not None else len(y)),
        waves=len(y),
        level=np.interp(grid, at, by_length),
    )


Segment = tuple[int, float, float]  # (sign of the saving: +1 pull faster, -1 recompute), from, to


@dataclass(frozen=True)
class Crossover:
    """The measured crossover: an estimate, its 95% interval and the verdict.

    ``low``/``high`` None: open on that side (below / above the measured range).
    ``estimate``: where the fitted curve changes sign in the direction of ``shape`` (rising
    for a crossing, falling for ``FALLING``; None: it does not, up to SEARCH x the range);
    outside ``lo .. hi`` it is an extrapolation. ``segments``: the stretches of the measured
    range where the band excludes 0, with the sign of the saving there."""

    shape: Shape
    status: Status
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    lo: float | None = None  # the measured range
    hi: float | None = None
    repetitions: int = 0
    requests: int = 0
    more_repetitions: int | None = None
    reason: str = ""  # why not decided, or why no data
    segments: tuple[Segment, ...] = ()

    @property
    def decided(self) -> bool:
        return self.status is Status.DECIDED

    @property
    def tokens(self) -> float | None:
        """The crossover when decided inside the range (what a threshold is set from)."""
        return self.estimate if self.decided and self.shape is Shape.CROSSING else None

    def covers(self, truth: float) -> bool:
        """Does the interval hold ``truth``? (No interval: it claims nothing, so yes.)"""
        if self.status is Status.UNDETERMINED or self.shape is Shape.NO_DATA:
            return True
        return (self.low is None or truth >= self.low) and (self.high is None or truth <= self.high)

    def interval_text(self) -> str:
        lo = f"{self.low:,.0f}" if self.low is not None else f"<{self.lo:,.0f}"
        hi = f"{self.high:,.0f}" if self.high is not None else f">{self.hi:,.0f}"
        return f"[{lo}, {hi}]"

    def segments_text(self) -> str:
        """``recompute faster at 128-700 tokens, pull faster at 900-2,048``."""
        names = {1: "pull faster", -1: "recompute faster"}
        return ", ".join(f"{names[g]} at {a:,.0f}-{b:,.0f}" for g, a, b in self.segments)

    def _where(self) -> str:
        if self.estimate is not None:
            return f"{self.estimate:,.0f} tokens, 95% CI {self.interval_text()}"
        return f"between {self.interval_text()[1:-1].replace(', ', ' and ')} tokens (95%)"

    def describe(self) -> str:
        """One phrase: the crossover with its interval, or why there is none."""
        if self.shape is Shape.NO_DATA:
            return f"n/a ({self.reason or 'no data'})"
        est = (
            f"fitted {self.estimate:,.0f} tokens"
            if self.estimate is not None
            else "the fitted saving does not turn positive"
        )
        if self.status is Status.UNDETERMINED:
            return f"not determined: {est}, no interval ({self.reason})"
        if self.status is Status.INCONCLUSIVE:
            return f"inconclusive: {est}, 95% CI {self.interval_text()} ({self.reason})"
        if self.shape is Shape.PULL_EVERYWHERE:
            return f"below the measured range: pull faster from {self.lo:,.0f} tokens on (95%)"
        if self.shape is Shape.RECOMPUTE_EVERYWHERE:
            return f"above the measured range: recompute faster up to {self.hi:,.0f} tokens (95%)"
        if self.shape is Shape.FALLING:
            return f"pull faster below {self._where()}; recompute faster above"
        if self.shape is Shape.MIXED:
            return f"the saving changes sign more than once: {self.segments_text()} tokens (95%)"
        return self._where()

    def short(self) -> str:
        """The verdict in a few words (plot titles)."""
        if self.shape is Shape.NO_DATA or self.status is Status.UNDETERMINED:
            return self.describe().split(" (")[0]
        if self.status is Status.INCONCLUSIVE:
            est = f"fitted {self.estimate:,.0f}" if self.estimate is not None else "no crossing"
            return f"inconclusive: {est}, 95% CI {self.interval_text()}"
        return self.describe()

    def to_dict(self) -> dict:
        return {
            "shape": self.shape.value,
            "verdict": self.status.value,
            "tokens": self.estimate,
            "low": self.low,
            "high": self.high,
            "lo": self.lo,
            "hi": self.hi,
            "repetitions": self.repetitions,
            "requests": self.requests,
            "more_repetitions": self.more_repetitions,
            "reason": self.reason,
            "segments": [{"sign": g, "from": a, "to": b} for g, a, b in self.segments],
            "text": self.describe(),
        }


def _runs(sign: np.ndarray) -> list[tuple[int, int, int]]:
    """(sign, first index, last index) of each run of equal values."""
    cuts = np.nonzero(np.diff(sign))[0]
    starts = np.concatenate([[0], cuts + 1])
    ends = np.concatenate([cuts, [len(sign) - 1]])
    return [(int(sign[a]), int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def crossover(curve: SavingCurve | None, reason: str = "") -> Crossover:
    """The verdict read off ``curve``'s band (module docstring).

    Along the measured range the band says, at each length, pull faster (it excludes 0
    above), recompute faster (below) or undecided. One change between decided signs is a
    crossing (rising: ``CROSSING``, falling: ``FALLING``), none with both ends decided is
    pull or recompute faster everywhere, more than one is ``MIXED``; an undecided end leaves
    the crossover open on that side (inconclusive), and so does an undecided stretch whose
    two sides agree (the band touches 0 without the saving changing sign)."""
    if curve is None:
        return Crossover(Shape.NO_DATA, Status.UNDETERMINED, reason=reason or "no pairs")
    grid, low, high = curve.grid, curve.low, curve.high
    common = dict(
        estimate=curve.root(),
        lo=curve.x_min,
        hi=curve.x_max,
        repetitions=curve.repetitions,
        requests=curve.requests,
    )
    if curve.undetermined:
        return Crossover(
            Shape.CROSSING,
            Status.UNDETERMINED,
            reason=f"{curve.repetitions} repetition(s) of a history length: its spread is "
            "unknown; run 3 or more (workload.repetitions)",
            **common,
        )
    measured_sign = np.where(low > 0, 1, np.where(high < 0, -1, 0))
    runs = _runs(measured_sign)
    segments = tuple((g, float(grid[a]), float(grid[b])) for g, a, b in runs if g)
    common["segments"] = segments
    decided = [g for g, _, _ in segments]
    filled = _beyond_the_crossing(measured_sign, decided)
    # the filled ends only place a crossing; "faster everywhere" needs the band itself
    sign = filled if (filled == 0).any() or len(set(decided)) > 1 else measured_sign
    flips = [(a, b) for a, b in zip(decided[:-1], decided[1:], strict=True) if a != b]
    k = len(grid)
    inside = np.nonzero(sign == 0)[0]
    if not len(inside):
        if not flips:
            everywhere = Shape.PULL_EVERYWHERE if decided[0] > 0 else Shape.RECOMPUTE_EVERYWHERE
            lo_ci, hi_ci = (None, curve.x_min) if decided[0] > 0 else (curve.x_max, None)
            return Crossover(everywhere, Status.DECIDED, low=lo_ci, high=hi_ci, **common)
        i = int(np.nonzero(sign[:-1] != sign[1:])[0][0])
        lo_ci, hi_ci = float(grid[i]), float(grid[i + 1])
    else:
        a, b = int(inside[0]), int(inside[-1])
        open_low, open_high = a == 0, b == k - 1
        lo_ci = None if open_low else float(grid[a - 1])
        hi_ci = None if open_high else float(grid[b + 1])
        as_fast = _as_fast_at_the_ends(curve, measured_sign, decided)
        if as_fast is not None:
            return replace(as_fast, **common)
        if open_low or open_high or not flips:
            out = Crossover(Shape.CROSSING, Status.INCONCLUSIVE, low=lo_ci, high=hi_ci, **common)
            if open_low or open_high:
                return _inconclusive(curve, out, open_low, open_high)
            side = "pull" if decided[0] > 0 else "recompute"
            why = (
                f"{side} is faster at both ends of the measured range and the saving's band "
                f"holds 0 only between {grid[a]:,.0f} and {grid[b]:,.0f} tokens: it touches 0 "
                "there without a decided change of sign"
            )
            return replace(out, reason=why)
    if len(flips) > 1:
        return Crossover(Shape.MIXED, Status.DECIDED, low=lo_ci, high=hi_ci, **common)
    rising = flips[0][1] > 0
    hull = (
        lo_ci if lo_ci is not None else curve.x_min,
        hi_ci if hi_ci is not None else curve.x_max,
    )
    roots = [h for h, up in curve.roots(*hull) if up == rising]
    common["estimate"] = roots[0] if roots else None
    shape = Shape.CROSSING if rising else Shape.FALLING
    return Crossover(shape, Status.DECIDED, low=lo_ci, high=hi_ci, **common)


def _beyond_the_crossing(sign: np.ndarray, decided: list[int]) -> np.ndarray:
    """``sign`` with an undecided stretch at an end taken as the decided sign next to it
    where no rising crossing can lie: below a stretch where recompute is decided faster,
    above one where pull is (a rising crossing there would need the saving to cross back:
    a second change of sign, which the band would have to show). A short undecided end
    where pull is decided faster next to it stays undecided (the crossing may lie below),
    and so does a long one next to recompute faster."""
    if not decided:
        return sign
    out = sign.copy()
    idx = np.nonzero(sign)[0]
    if decided[0] < 0:
        out[: idx[0]] = -1
    if decided[-1] > 0:
        out[idx[-1] + 1 :] = 1
    return out


def _as_fast_at_the_ends(
    curve: SavingCurve, sign: np.ndarray, decided: list[int]
) -> Crossover | None:
    """Pull (recompute) faster everywhere, decided, when the saving is decided one way
    somewhere and never the other, and wherever the band holds 0 (the ends of the range)
    its slower-side bound stays within ``EQUIVALENCE_SHARE`` of the TTFT: there the flow is
    as fast, within that margin (None otherwise)."""
    if curve.level is None or len(set(decided)) != 1:
        return None
    margin = EQUIVALENCE_SHARE * curve.level
    undecided = sign == 0
    if not undecided.any():
        return None
    if decided[0] > 0 and np.all(curve.low[undecided] >= -margin[undecided]):
        shape, low_ci, high_ci, flow = Shape.PULL_EVERYWHERE, None, curve.x_min, "pull"
    elif decided[0] < 0 and np.all(curve.high[undecided] <= margin[undecided]):
        shape, low_ci, high_ci, flow = Shape.RECOMPUTE_EVERYWHERE, curve.x_max, None, "recompute"
    else:
        return None
    edge = curve.grid[undecided]
    why = (
        f"{flow} is as fast or faster at every measured length: faster where the band "
        f"excludes 0, within {EQUIVALENCE_SHARE:.0%} of TTFT where it holds 0 "
        f"({edge.min():,.0f}-{edge.max():,.0f} tokens)"
    )
    return Crossover(shape, Status.DECIDED, low=low_ci, high=high_ci, reason=why)


def _inconclusive(curve: SavingCurve, c: Crossover, open_low: bool, open_high: bool):
    """Say why, and how many repetitions would decide it: an open end closes once the saving
    at that end of the range is decided (negative at the shortest length, positive at the
    longest), so the repetitions are ``stats.repetitions_to_decide`` of that end's value."""
    span = f"{curve.x_min:,.0f}-{curve.x_max:,.0f} tokens"
    if open_low and open_high:
        why = f"the saving's 95% band holds 0 at every measured length ({span})"
    else:
        why = f"its 95% interval leaves the measured range ({span})"
    needed: list[int | None] = []
    unchanged = []
    for is_open, j, sign, side in ((open_low, 0, -1, "shorter"), (open_high, -1, 1, "longer")):
        if not is_open:
            continue
        value = float(curve.fit[j])
        if value * sign <= 0:
            unchanged.append(side)
            needed.append(None)
            continue
        needed.append(
            repetitions_to_decide(value, float(curve.se[j]), float(curve.df[j]), curve.repetitions)
        )
    if unchanged:
        why += (
            "; the fitted saving does not change sign there: measure "
            f"{' and '.join(unchanged)} histories"
        )
    known = [n for n in needed if n is not None]
    more = max(known) if known and len(known) == len(needed) else None
    if more is not None:
        why += f"; about {more} repetitions per length (now {curve.repetitions}) would decide it"
    elif needed and all(n is None for n in needed) and "measure" not in why:
        why += f"; more than {MAX_REPETITIONS} repetitions would be needed at these lengths"
    return replace(c, more_repetitions=more, reason=why)
