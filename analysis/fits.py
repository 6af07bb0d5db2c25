"""Cost models fitted to measurements (pure numpy).

- recompute: ``TTFT(n) = c0 + c1 n + c2 n^2`` over ``n`` prompt tokens computed (a fixed
  cost, the per-token matmuls, the attention term), coefficients non-negative;
- transfer: ``t(bytes) = alpha + bytes / beta`` (per-transfer latency, bandwidth).

Both are non-negative least squares on *relative* residuals (each row divided by its
measured value), so a 5 ms point counts as much as a 5 s one and ``alpha`` is not swamped
by the largest transfers. The quality numbers (R^2, RMSE, residuals) are on the original
scale.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few columns (every active set is tried)."""
    cols = a.shape[1]
    best, best_err = np.zeros(cols), float(np.sum(y**2))
    for k in range(1, cols + 1):
        for subset in itertools.combinations(range(cols), k):
            coef, *_ = np.linalg.lstsq(a[:, subset], y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((a[:, subset] @ coef - y) ** 2))
            if err < best_err - 1e-15 * max(1.0, best_err):
                best_err = err
                best = np.zeros(cols)
                best[list(subset)] = coef
    return best


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


def _relative_nnls(columns: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    a = np.column_stack(columns)
    w = 1.0 / np.where(y > 0, y, 1.0)
    return nnls(a * w[:, None], y * w)


def _clean(xs: Sequence[float], ys: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y) & (x >= 0) & (y > 0)
    return x[keep], y[keep]


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

    def seconds(self, tokens: float | np.ndarray) -> float | np.ndarray:
        return self.c0_s + self.c1_s_per_token * tokens + self.c2_s_per_token2 * tokens**2

    @property
    def tokens_per_s(self) -> float:
        """Marginal prefill rate at short prompts (``1 / c1``)."""
        return 1.0 / self.c1_s_per_token if self.c1_s_per_token > 0 else math.inf


def fit_recompute(tokens: Sequence[float], ttft_s: Sequence[float]) -> RecomputeFit | None:
    """None with fewer than two distinct prompt lengths."""
    x, y = _clean(tokens, ttft_s)
    distinct = len(np.unique(np.round(x)))
    if distinct < 2:
        return None
    quadratic = distinct >= 3
    cols = [np.ones_like(x), x] + ([x**2] if quadratic else [])
    coef = _relative_nnls(cols, y)
    c0, c1 = float(coef[0]), float(coef[1])
    c2 = float(coef[2]) if quadratic else 0.0
    pred = c0 + c1 * x + c2 * x**2
    return RecomputeFit(c0, c1, c2, quality(y, pred), float(x.min()), float(x.max()), quadratic)


@dataclass
class TransferFit:
    """Seconds of one transfer of ``bytes``: ``alpha + bytes / beta``."""

    alpha_s: float
    beta_bytes_per_s: float  # inf: no size dependence seen
    quality: FitQuality
    bytes_min: float
    bytes_max: float
    source: str = ""  # where the samples came from (trace, bench, point totals)

    def seconds(self, nbytes: float | np.ndarray) -> float | np.ndarray:
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    @property
    def gb_s(self) -> float:
        return self.beta_bytes_per_s / 1e9


def fit_transfer(
    nbytes: Sequence[float], seconds: Sequence[float], source: str = ""
) -> TransferFit | None:
    """None without two distinct sizes."""
    x, y = _clean(nbytes, seconds)
    if len(np.unique(x)) < 2:
        return None
    coef = _relative_nnls([np.ones_like(x), x], y)
    alpha, slope = float(coef[0]), float(coef[1])
    beta = 1.0 / slope if slope > 0 else math.inf
    pred = alpha + slope * x
    return TransferFit(alpha, beta, quality(y, pred), float(x.min()), float(x.max()), source)
