"""Cost models fitted to measurements, with 95% intervals on their parameters (numpy, scipy).

- recompute: ``TTFT(n) = c0 + c1 n + c2 n^2`` over ``n`` prompt tokens computed (a fixed
  cost, the per-token matmuls, the attention term), coefficients non-negative;
- transfer: ``t(bytes) = alpha + bytes / beta`` (per-transfer latency, bandwidth).

Both are non-negative least squares on *relative* residuals (each row divided by its
fitted value, ``_fit``), so a 5 ms point counts as much as a 5 s one and ``alpha`` is not
swamped by the largest transfers. The quality numbers (R^2, RMSE, residuals) are on the original
scale.

Parameter intervals: the samples come in clusters (the waves of one Point, the transfers of
one Point) that are resampled as wholes (a pairs bootstrap of the regression, Freedman
1981, with ``stats.bootstrap_interval``'s Rao-Wu weights), the NNLS solved for every
replicate; ``estimate +- t * se``, the lower bound clipped at 0 (the parameters are
non-negative). Degrees of freedom: samples - parameters; a fit with fewer than
``MIN_DF`` makes no prediction (it passes through its points whatever their noise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls as _nnls

from analysis.method.stats import bootstrap_interval

MIN_DF = 2  # a fit with fewer degrees of freedom makes no prediction
MIN_TRANSFER_SIZES = 3  # distinct transfer sizes the transfer fit needs
POOR_R2 = 0.5  # a fit below this gets a note


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares (``scipy.optimize.nnls``), on columns scaled to unit norm
    (a constant, tokens and tokens^2 differ by 10^9)."""
    a = np.asarray(a, float)
    norm = np.linalg.norm(a, axis=0)
    norm = np.where(norm > 0, norm, 1.0)
    return _nnls(a / norm, np.asarray(y, float))[0] / norm


@dataclass
class FitQuality:
    n: int
    r2: float
    rmse: float
    max_abs_residual: float
    residuals: list[float] = field(default_factory=list)


def quality(y: np.ndarray, pred: np.ndarray) -> FitQuality:
    res = y - pred
    ss_res = float(np.sum(res**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else math.nan)
    return FitQuality(
        n=len(y),
        r2=r2,
        rmse=math.sqrt(ss_res / len(y)) if len(y) else math.nan,
        max_abs_residual=float(np.max(np.abs(res))) if len(y) else math.nan,
        residuals=[float(r) for r in res],
    )


def _clean(xs, ys, clusters):
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    c = np.arange(len(x)) if clusters is None else np.asarray(clusters)
    keep = np.isfinite(x) & np.isfinite(y) & (x >= 0) & (y > 0)
    return x[keep], y[keep], c[keep]


def _fit(cols: list[np.ndarray], y: np.ndarray, clusters: np.ndarray):
    """(coefficients, lows, highs, df) of the relative NNLS, intervals over clusters.

    Relative to the *fitted* value: a first pass weighs each row by 1 / its measured value,
    the second (the one reported) by 1 / the first pass's prediction. Dividing by the
    measured value alone pulls the fit low under multiplicative noise (the rows that
    happened to come out small weigh the most)."""
    a = np.column_stack(cols)
    first = nnls(a / y[:, None], np.ones_like(y))
    pred = a @ first
    w = 1.0 / np.where(pred > 0, pred, y)
    aw, yw = a * w[:, None], y * w
    _, cl = np.unique(clusters, return_inverse=True)
    g = int(cl.max()) + 1

    def stat(weights: np.ndarray) -> np.ndarray:
        # a cluster drawn k times weighs its rows' squared residuals k times
        root = np.sqrt(weights[:, cl])
        return np.array([nnls(aw * r[:, None], yw * r) for r in root])

    spread = bootstrap_interval(stat, np.zeros(g, int), n_boot=1000, seed=0)
    low, high = spread.bounds()
    return spread.estimate, np.maximum(low, 0.0), high, len(y) - a.shape[1]


@dataclass
class RecomputeFit:
    """TTFT in seconds of a prompt of ``n`` computed tokens."""

    c0_s: float
    c1_s_per_token: float
    c2_s_per_token2: float
    quality: FitQuality
    tokens_min: float
    tokens_max: float
    quadratic: bool  # False: too few distinct lengths for the attention term
    df: int = 0
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> 95% bounds

    def seconds(self, tokens: float | np.ndarray) -> float | np.ndarray:
        return self.c0_s + self.c1_s_per_token * tokens + self.c2_s_per_token2 * tokens**2

    @property
    def predicts(self) -> bool:
        return self.df >= MIN_DF

    @property
    def tokens_per_s(self) -> float:
        """Marginal prefill rate at short prompts (``1 / c1``)."""
        return 1.0 / self.c1_s_per_token if self.c1_s_per_token > 0 else math.inf


def fit_recompute(
    tokens: Sequence[float], ttft_s: Sequence[float], clusters: Sequence | None = None
) -> RecomputeFit | None:
    """None with fewer than two distinct prompt lengths. ``clusters``: the Point of each
    sample (resampled together); each sample alone when None."""
    x, y, c = _clean(tokens, ttft_s, clusters)
    distinct = len(np.unique(np.round(x)))
    if distinct < 2:
        return None
    quadratic = distinct >= 3
    cols = [np.ones_like(x), x] + ([x**2] if quadratic else [])
    coef, low, high, df = _fit(cols, y, c)
    c0, c1 = float(coef[0]), float(coef[1])
    c2 = float(coef[2]) if quadratic else 0.0
    pred = c0 + c1 * x + c2 * x**2
    names = ["c0_s", "c1_s_per_token", "c2_s_per_token2"][: len(coef)]
    ci = {n: (float(lo), float(hi)) for n, lo, hi in zip(names, low, high, strict=True)}
    return RecomputeFit(
        c0, c1, c2, quality(y, pred), float(x.min()), float(x.max()), quadratic, df, ci
    )


@dataclass
class TransferFit:
    """Seconds of one transfer of ``bytes``: ``alpha + bytes / beta``."""

    alpha_s: float
    beta_bytes_per_s: float  # inf: no size dependence seen
    quality: FitQuality
    bytes_min: float
    bytes_max: float
    source: str = ""  # where the samples came from (P<-D traces, bench)
    sizes: int = 0  # distinct transfer sizes
    df: int = 0
    alpha_ci_s: tuple[float, float] = (math.nan, math.nan)
    gb_s_ci: tuple[float, float] = (math.nan, math.nan)  # beta's interval, GB/s

    def seconds(self, nbytes: float | np.ndarray) -> float | np.ndarray:
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    @property
    def gb_s(self) -> float:
        return self.beta_bytes_per_s / 1e9

    @property
    def predicts(self) -> bool:
        return self.df >= MIN_DF and self.sizes >= MIN_TRANSFER_SIZES

    def why_not(self) -> str:
        """Why it makes no prediction ('' when it does)."""
        if self.sizes < MIN_TRANSFER_SIZES:
            return f"{self.sizes} transfer sizes (needs {MIN_TRANSFER_SIZES} or more)"
        if self.df < MIN_DF:
            return f"{self.df} degrees of freedom (needs {MIN_DF})"
        return ""


def fit_transfer(
    nbytes: Sequence[float],
    seconds: Sequence[float],
    source: str = "",
    clusters: Sequence | None = None,
) -> TransferFit | None:
    """None without two distinct sizes (then no line can be drawn at all)."""
    x, y, c = _clean(nbytes, seconds, clusters)
    sizes = len(np.unique(x))
    if sizes < 2:
        return None
    coef, low, high, df = _fit([np.ones_like(x), x], y, c)
    alpha, slope = float(coef[0]), float(coef[1])
    beta = 1.0 / slope if slope > 0 else math.inf

    def gb(s: float) -> float:
        return 1.0 / s / 1e9 if s > 0 else math.inf

    return TransferFit(
        alpha,
        beta,
        quality(y, alpha + slope * x),
        float(x.min()),
        float(x.max()),
        source,
        sizes,
        df,
        (float(low[0]), float(high[0])),
        (gb(float(high[1])), gb(float(low[1]))),
    )
