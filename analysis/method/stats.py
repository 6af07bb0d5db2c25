"""Intervals for paired, repeated measurements (numpy and scipy's t, seeded).

The independent unit is the **repetition**: one Point per flow at a (deployment, workload
kind, history length), measured with fresh conversations and their own cache salt. Its
requests are not independent of each other: a turn's requests run as one batched wave and
share the machine's state, so a cell of 2-4 requests is about one sample. Everything here
therefore works on per-repetition summaries (the mean paired difference of a repetition's
requests, a "cluster"), grouped in strata (the history lengths: each has its own
repetitions, and its own level of noise).

Method (one paragraph a reviewer can check):

- **Estimate**: a statistic of the cluster means, each repetition weighted equally within its
  stratum (a stratum's requests are averaged inside their repetition first).
- **Spread**: a stratified cluster bootstrap. Repetitions are resampled with replacement within
  each stratum, Rao & Wu's (1988) rescaled way: ``R_s - 1`` draws out of ``R_s``, each
  drawn repetition weighted ``R_s / (R_s - 1)`` per draw, so that the bootstrap variance of a
  mean is the unbiased ``s^2 / R`` (a plain bootstrap gives ``(R - 1) / R`` of it: 2/3 at
  three repetitions). Requests are *not* resampled again inside the drawn repetitions:
  a repetition's mean already carries its requests' spread, and resampling both levels
  counts it twice (Davison & Hinkley 1997, section 3.8). For a statistic that is linear in
  the cluster means (a difference; a fitted curve's value, treating its weights as given:
  ``saving_curve``'s weights are estimated from the same runs' TTFT levels, and their own
  spread is left out) the bootstrap
  variance converges to the closed form ``sum_s R_s / (R_s - 1) sum_g (L_g - mean_s L)^2``
  of the clusters' contributions ``L_g``: ``linear_interval`` uses that closed form (no
  Monte Carlo error); ``bootstrap_interval`` resamples, vectorised as a replicates x
  clusters weight matrix, for statistics that are not linear (ratios, fits with bounds).
- **Interval**: Student-t on that standard error, ``estimate +- t(0.975, df) * se``, with
  ``df`` the Welch-Satterthwaite degrees of freedom of the strata's shares of the variance
  (``R_s - 1`` each). Why not bootstrap percentiles: with 3-5 repetitions the percentile
  interval of a mean spans at most the range of the repetitions and uses normal quantiles,
  so it covers ~75-85% instead of 95% (``t(0.975, 2) = 4.30`` vs ``1.96``). The t interval
  is exact only for one stratum of normal cluster means; across strata of unequal spread
  the Satterthwaite df make it an approximation (Welch's), and the means of heavy-tailed
  requests are only near normal. How near is measured, not assumed: the calibration test
  (``tests/unit/test_analysis_calibration.py``, ``benchmarks/calibration.py``) checks the
  coverage at 50% and 95% at every length on synthetic runs as rough as real ones, and
  checks that the check fails for each deliberate break of the method.
- **Decided or not**: a difference is decided when its interval excludes 0. When it does
  not, ``repetitions_to_decide`` estimates how many repetitions per stratum would, assuming
  the estimate and the per-repetition spread stay as measured: the smallest ``R'`` with
  ``(t(0.975, df') + z(0.80)) * se * sqrt(R / R') <= |estimate|``, ``df' = df (R' - 1) /
  (R - 1)`` (80% power to exclude 0; None past ``MAX_REPETITIONS`` or for a zero estimate).

With one repetition in a stratum its spread is unknown: no interval ("undetermined").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum
from statistics import NormalDist

import numpy as np
from scipy.stats import t as _student

LEVEL = 0.95
POWER = 0.80
N_BOOT = 2000
MAX_REPETITIONS = 100  # beyond this, "more repetitions" is not a practical answer
CALIBRATION_RUNS = 120  # seeded synthetic runs the unit-tier calibration test checks
CALIBRATION_SIGMAS = 3.0  # its acceptance bands: this many binomial sigmas around a rate


class Status(StrEnum):
    DECIDED = "decided"  # the interval excludes 0 (or the crossover lies inside the range)
    INCONCLUSIVE = "inconclusive"  # the data cannot decide
    UNDETERMINED = "undetermined"  # no interval: fewer than 2 repetitions


# ---- distributions ---------------------------------------------------------------------------


def t_quantile(p: float, df: float) -> float:
    """Student-t quantile (``scipy.stats.t``; ``df`` inf: the normal; nan for df <= 0)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} must be in (0, 1)")
    if not df > 0:
        return math.nan
    return float(_student.ppf(p, df)) if math.isfinite(df) else NormalDist().inv_cdf(p)


def t_crit(df: float, level: float = LEVEL) -> float:
    """The two-sided ``level`` critical value of Student's t."""
    return float(t_crits(np.array([df], float), level)[0])


def t_crits(df: np.ndarray, level: float = LEVEL) -> np.ndarray:
    """``t_crit`` for an array of dfs (nan where df <= 0 or nan; inf: the normal's)."""
    return METHOD.t_crits(df, level)


def student_t_crits(df: np.ndarray, level: float = LEVEL) -> np.ndarray:
    """Student's t quantiles (the method's ``t_crits``)."""
    d = np.asarray(df, float)
    ok = d > 0  # nan compares False
    return np.where(ok, _student.ppf(0.5 + level / 2.0, np.where(ok, d, 1.0)), np.nan)


def rate_tolerance(p: float, n: int, sigmas: float = CALIBRATION_SIGMAS) -> float:
    """``sigmas`` standard deviations of a rate observed over ``n`` independent trials whose
    true rate is ``p`` (``sqrt(p (1 - p) / n)`` each): the calibration test's bands."""
    return sigmas * math.sqrt(p * (1.0 - p) / n)


# ---- designs ---------------------------------------------------------------------------------


def strata_sizes(strata: np.ndarray) -> dict[int, int]:
    """Stratum label -> repetitions (clusters) in it."""
    labels, counts = np.unique(np.asarray(strata), return_counts=True)
    return {int(s): int(n) for s, n in zip(labels, counts, strict=True)}


def satterthwaite(variances: np.ndarray, dfs: np.ndarray) -> np.ndarray:
    """Welch-Satterthwaite df of a sum of independent variance estimates.

    ``variances``: (S, ...) per stratum; ``dfs``: (S,). Strata with no variance drop out;
    a total of 0 gives ``inf`` (no spread at all: the t quantile is the normal one)."""
    v = np.asarray(variances, float)
    d = np.asarray(dfs, float).reshape((-1,) + (1,) * (v.ndim - 1))
    total = v.sum(axis=0)
    denom = np.where(d > 0, v**2 / np.where(d > 0, d, 1.0), 0.0).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, total**2 / np.where(denom > 0, denom, 1.0), np.inf)


@dataclass(frozen=True)
class Spread:
    """Point estimates with their standard errors and degrees of freedom (arrays, one per
    statistic); ``undetermined`` where a stratum behind them has one repetition."""

    estimate: np.ndarray
    se: np.ndarray
    df: np.ndarray
    undetermined: np.ndarray  # bool

    def bounds(self, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
        half = t_crits(self.df, level) * self.se
        low, high = self.estimate - half, self.estimate + half
        return np.where(self.undetermined, np.nan, low), np.where(self.undetermined, np.nan, high)


def linear_interval(contrib: np.ndarray, strata: np.ndarray) -> Spread:
    """The method's spread of sums of per-cluster contributions (``rao_wu_spread``)."""
    return METHOD.linear_interval(contrib, strata)


def rao_wu_spread(contrib: np.ndarray, strata: np.ndarray) -> Spread:
    """Closed-form spread of statistics that are sums of per-cluster contributions.

    ``contrib``: (G, K), cluster ``g``'s contribution ``L_g`` to each of ``K`` statistics
    (``theta_k = sum_g L_gk``); ``strata``: (G,) labels. Variance: ``sum_s R_s/(R_s-1)
    sum_{g in s} (L_g - mean_s L)^2`` (the Rao-Wu bootstrap's limit), df: Satterthwaite."""
    c = np.asarray(contrib, float)
    c = c[:, None] if c.ndim == 1 else c
    strata = np.asarray(strata)
    est = c.sum(axis=0)
    parts, dfs = [], []
    undetermined = np.zeros(c.shape[1], bool)
    for s, n in strata_sizes(strata).items():
        rows = c[strata == s]
        if n < 2:
            undetermined |= np.any(rows != 0, axis=0)
            continue
        dev = rows - rows.mean(axis=0)
        parts.append(n / (n - 1) * (dev**2).sum(axis=0))
        dfs.append(n - 1)
    if not parts:
        zeros = np.zeros_like(est)
        return Spread(est, zeros, np.full_like(est, np.nan), np.ones_like(est, bool))
    v = np.array(parts)
    return Spread(est, np.sqrt(v.sum(axis=0)), satterthwaite(v, np.array(dfs)), undetermined)


def rao_wu_weights(n: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot, n) replicate weights of one stratum of ``n`` repetitions: ``n - 1`` draws
    with replacement, each draw weighing ``n / (n - 1)`` (so the weights sum to ``n``)."""
    if n < 2:
        return np.ones((n_boot, max(n, 0)))
    draws = rng.integers(0, n, size=(n_boot, n - 1))
    counts = np.zeros((n_boot, n))
    np.add.at(counts, (np.repeat(np.arange(n_boot), n - 1), draws.ravel()), 1.0)
    return counts * (n / (n - 1))


def replicate_weights(strata: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, G) Rao-Wu weights resampling every stratum at once."""
    strata = np.asarray(strata)
    rng = np.random.default_rng(seed)
    w = np.ones((n_boot, len(strata)))
    for s, n in strata_sizes(strata).items():
        idx = np.nonzero(strata == s)[0]
        w[:, idx] = rao_wu_weights(n, n_boot, rng)
    return w


Statistic = Callable[[np.ndarray], np.ndarray]  # (B, G) cluster weights -> (B, K) values


def bootstrap_interval(
    stat: Statistic, strata: np.ndarray, n_boot: int = N_BOOT, seed: int = 0
) -> Spread:
    """Spread of a (possibly non-linear) statistic of weighted clusters.

    ``stat(w)`` takes a (B, G) weight matrix (all ones: the data as measured) and returns
    (B, K). Each stratum is resampled on its own (its columns of ``replicate_weights``, the
    others held as measured): its share of the variance, and so the Satterthwaite df, is
    then known; strata are independent, so the shares add up."""
    strata = np.asarray(strata)
    g = len(strata)
    est = np.atleast_1d(np.asarray(stat(np.ones((1, g))), float)[0])
    drawn = replicate_weights(strata, n_boot, seed)
    parts, dfs = [], []
    undetermined = np.zeros(est.shape, bool)
    for s, n in strata_sizes(strata).items():
        idx = np.nonzero(strata == s)[0]
        if n < 2:
            probe = np.ones((1, g))
            probe[0, idx] = 0.5  # does the statistic depend on this stratum at all?
            moved = np.atleast_1d(np.asarray(stat(probe), float)[0])
            undetermined |= ~np.isclose(moved, est, equal_nan=True)
            continue
        w = np.ones((n_boot, g))
        w[:, idx] = drawn[:, idx]
        vals = np.asarray(stat(w), float).reshape(n_boot, -1)
        parts.append(np.nanvar(vals, axis=0, ddof=1))
        dfs.append(n - 1)
    if not parts:
        return Spread(est, np.zeros_like(est), np.full_like(est, np.nan), np.ones_like(est, bool))
    v = np.array(parts)
    return Spread(est, np.sqrt(v.sum(axis=0)), satterthwaite(v, np.array(dfs)), undetermined)


# ---- verdicts --------------------------------------------------------------------------------


def repetitions_to_decide(
    estimate: float, se: float, df: float, repetitions: int, power: float = POWER
) -> int | None:
    """Repetitions per stratum (in total, not more) that would exclude 0 with ``power``,
    if the estimate and the per-repetition spread stay as measured (module docstring)."""
    if not (np.isfinite(estimate) and np.isfinite(se)) or estimate == 0 or repetitions < 2:
        return None
    if se == 0:
        return repetitions
    zp = NormalDist().inv_cdf(power)
    per = df / max(repetitions - 1, 1) if np.isfinite(df) else math.inf
    r = np.arange(repetitions, MAX_REPETITIONS + 1)
    d = per * (r - 1) if np.isfinite(per) else np.full(len(r), math.inf)
    enough = (t_crits(d) + zp) * se * np.sqrt(repetitions / r) <= abs(estimate)
    return int(r[np.argmax(enough)]) if enough.any() else None


@dataclass(frozen=True)
class Verdict:
    """A difference with its 95% interval, and what it lets one say.

    ``estimate``/``low``/``high`` in the statistic's unit (``unit``); ``repetitions``: the
    fewest repetitions of any stratum behind it; ``requests``: paired requests behind it.
    ``more_repetitions``: repetitions per stratum estimated to decide it (None: decided,
    unknown, or beyond ``MAX_REPETITIONS``)."""

    estimate: float
    low: float
    high: float
    se: float
    df: float
    repetitions: int
    requests: int
    status: Status
    unit: str = "ms"
    more_repetitions: int | None = None

    @property
    def decided(self) -> bool:
        return self.status is Status.DECIDED

    def within(self, lowest: float, highest: float = math.inf) -> Verdict:
        """The same verdict with its bounds clipped to what the quantity can be (a share of
        a cache stays in [0, 100] %, a duration is not negative): a t interval of a few
        repetitions of a level near its limit would otherwise cross it."""
        if not np.isfinite(self.low):
            return self
        low = min(max(self.low, lowest), highest)
        high = min(max(self.high, lowest), highest)
        return replace(self, low=low, high=high)

    def interval(self, fmt: str = "{:,.1f}", signed: bool = True) -> str:
        """``+12.3 ms [4.1, 20.5]`` (``signed``: a difference; else a level, ``12.3 ms
        [...]``); ``[no interval]`` when undetermined."""
        if not np.isfinite(self.estimate):
            return "not measured"
        est = _fmt(fmt, self.estimate)
        shown = signed and self.estimate > 0 and not est.startswith("+") and not _zero(est)
        sign = "+" if shown else ""
        unit = f" {self.unit}" if self.unit else ""
        if self.status is Status.UNDETERMINED or not np.isfinite(self.low):
            return f"{sign}{est}{unit} [no interval]"
        return f"{sign}{est}{unit} [{_fmt(fmt, self.low)}, {_fmt(fmt, self.high)}]"

    def why(self) -> str:
        """Why it is not decided, with the repetitions that would decide it."""
        if self.status is Status.DECIDED:
            return ""
        if self.status is Status.UNDETERMINED:
            return (
                f"{self.repetitions} repetition(s): its spread is unknown; "
                "run 3 or more (workload.repetitions)"
            )
        if self.more_repetitions is None:
            return "the 95% interval spans 0; the difference is too small to decide here"
        return (
            f"the 95% interval spans 0; about {self.more_repetitions} repetitions "
            f"(now {self.repetitions}) would decide it"
        )

    def to_dict(self) -> dict:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "se": self.se,
            "df": self.df,
            "repetitions": self.repetitions,
            "requests": self.requests,
            "verdict": self.status.value,
            "unit": self.unit,
            "more_repetitions": self.more_repetitions,
            "text": self.interval(),
        }


def _zero(text: str) -> bool:
    """Does this formatted value read as zero ("0", "-0.0", "+0")?"""
    digits = text.lstrip("+-").replace(",", "").replace(".", "").replace("0", "")
    return not digits.strip()


def _fmt(fmt: str, value: float) -> str:
    """``fmt`` of ``value``, without the sign of a value that rounds to zero ("-0")."""
    text = fmt.format(value)
    return text.lstrip("+-") if _zero(text) else text


def verdicts(
    spread: Spread,
    repetitions: int,
    requests: list[int] | int,
    unit: str = "ms",
    level: float = LEVEL,
):
    """One ``Verdict`` per statistic of ``spread`` (decided: its ``level`` interval excludes
    0; ``more_repetitions`` is always for the 95% one)."""
    low, high = spread.bounds(level)
    n = len(spread.estimate)
    reqs = requests if isinstance(requests, list) else [requests] * n
    out = []
    for k in range(n):
        est, se, df = float(spread.estimate[k]), float(spread.se[k]), float(spread.df[k])
        if spread.undetermined[k] or repetitions < 2 or not np.isfinite(low[k]):
            status, more = Status.UNDETERMINED, None
        elif low[k] > 0 or high[k] < 0:
            status, more = Status.DECIDED, None
        else:
            status = Status.INCONCLUSIVE
            more = repetitions_to_decide(est, se, df, repetitions)
        out.append(
            Verdict(
                est,
                float(low[k]),
                float(high[k]),
                se,
                df,
                repetitions,
                int(reqs[k]),
                status,
                unit,
                more,
            )
        )
    return out


def mean_verdict(values: np.ndarray, unit: str = "ms", requests: int | None = None) -> Verdict:
    """The mean of independent per-repetition values, with its t interval."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    if not len(v):
        return Verdict(
            math.nan, math.nan, math.nan, math.nan, math.nan, 0, 0, Status.UNDETERMINED, unit
        )
    spread = linear_interval((v / len(v))[:, None], np.zeros(len(v), int))
    return verdicts(spread, len(v), requests if requests is not None else len(v), unit)[0]


@dataclass(frozen=True)
class Method:
    """The interval method's two replaceable parts: the spread of sums of per-cluster
    contributions and the critical values. ``method`` swaps them for the length of a block:
    the calibration benchmark breaks each part on purpose and shows the calibration check
    catches it (``benchmarks/calibration.py``); the analysis never swaps them."""

    linear_interval: Callable[[np.ndarray, np.ndarray], Spread]
    t_crits: Callable[..., np.ndarray]


METHOD = Method(linear_interval=rao_wu_spread, t_crits=student_t_crits)


@contextlib.contextmanager
def method(**parts: Callable) -> Iterator[Method]:
    """``METHOD`` with ``parts`` replaced inside the block, restored after."""
    global METHOD
    saved = METHOD
    METHOD = replace(saved, **parts)
    try:
        yield METHOD
    finally:
        METHOD = saved
