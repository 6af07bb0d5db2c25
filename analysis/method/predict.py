"""Crossovers predicted from cost models, not measured (pure numpy).

- from the fits: computing ``h`` history tokens costs ``c1 h + c2 h^2`` more than not
  computing them (``c0`` and the new tokens' own cost cancel; so does their attention to
  the history: ``c2 (u + h)^2 - c2 (u^2 + 2 u h) = c2 h^2``); pulling costs
  ``alpha + h * bytes_per_token / beta``;
- from first principles: the FLOPs of those ``h`` tokens (``model_cost``) at the measured
  prefill rate (marginal FLOP/s of the recompute prompts) against their KV bytes at the
  measured bandwidth (median of the largest third of the transfers, ``alpha`` taken off
  each) plus ``alpha``.

Both assume D keeps the history in its prefix cache in both flows, so the P->D hand-off of
the new tokens is common to both and only "compute h vs pull h" differs. Bytes are per
transfer: a transfer moves one D rank's KV heads (``transfer_bytes_per_token``), as the
bench records and traces count them, and the D ranks' transfers run side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from analysis.method.fits import RecomputeFit, TransferFit
from analysis.method.model_cost import ModelShape
from analysis.method.saving_curve import Shape

MAX_TOKENS = 1 << 20  # the range searched for predicted crossovers

Saving = Callable[[np.ndarray], np.ndarray]  # seconds recompute - pull at history h


@dataclass(frozen=True)
class Prediction:
    tokens: float | None  # None unless ``shape`` is CROSSING
    shape: Shape
    reason: str = ""  # why there is none

    def describe(self) -> str:
        if self.shape is Shape.CROSSING:
            return f"{self.tokens:,.0f} tokens"
        if self.shape is Shape.PULL_EVERYWHERE:
            return "none: pull faster at every length"
        if self.shape is Shape.RECOMPUTE_EVERYWHERE:
            return f"none: recompute faster up to {MAX_TOKENS:,} tokens"
        return f"n/a ({self.reason or 'no data'})"

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "shape": self.shape.value, "text": self.describe()}


def predicted_crossover(saving: Saving, max_tokens: float = MAX_TOKENS) -> Prediction:
    """Where ``saving(h)`` turns positive for good, searched over 1 .. ``max_tokens``."""
    h = np.geomspace(1.0, max_tokens, 4000)
    s = saving(h)
    not_faster = np.nonzero(s <= 0)[0]
    if len(not_faster) == 0:
        return Prediction(None, Shape.PULL_EVERYWHERE)
    i = int(not_faster[-1])
    if i == len(h) - 1:
        return Prediction(None, Shape.RECOMPUTE_EVERYWHERE)
    a, b = h[i], h[i + 1]
    for _ in range(60):
        mid = 0.5 * (a + b)
        if saving(np.array([mid]))[0] <= 0:
            a = mid
        else:
            b = mid
    return Prediction(float(b), Shape.CROSSING)


def none(reason: str) -> Prediction:
    return Prediction(None, Shape.NO_DATA, reason)


def transfer_bytes_per_token(shape: ModelShape, d_tp: int) -> float:
    """KV bytes per token that one transfer moves: one D rank's heads (every transfer is
    between a P rank and a D rank; the D ranks' transfers run side by side)."""
    return shape.kv_bytes_per_token / min(max(int(d_tp or 1), 1), shape.num_kv_heads)


def fit_saving(fit: RecomputeFit, transfer: TransferFit, bytes_per_token: float) -> Saving:
    """``bytes_per_token``: what one transfer moves per token (``transfer_bytes_per_token``)."""

    def saving(h: np.ndarray) -> np.ndarray:
        compute = fit.c1_s_per_token * h + fit.c2_s_per_token2 * h**2
        return compute - (transfer.alpha_s + h * bytes_per_token / transfer.beta_bytes_per_s)

    return saving


def first_principles_saving(
    shape: ModelShape,
    flops_per_s: float,
    bytes_per_s: float,
    alpha_s: float = 0.0,
    bytes_per_token: float | None = None,
) -> Saving:
    """Computing ``h`` tokens (their FLOPs at ``flops_per_s``) vs pulling their KV
    (``bytes_per_token`` per transfer, the whole model's KV by default)."""
    linear = shape.flops_per_token(0.0)
    attn = 4.0 * shape.num_layers * shape.q_dim
    per_token = shape.kv_bytes_per_token if bytes_per_token is None else bytes_per_token

    def saving(h: np.ndarray) -> np.ndarray:
        compute = (linear * h + attn * h * (h - 1) / 2.0) / flops_per_s
        return compute - (alpha_s + h * per_token / bytes_per_s)

    return saving


def effective_flops(shape: ModelShape, tokens: np.ndarray, seconds: np.ndarray) -> float | None:
    """Prefill FLOP/s measured on the recompute prompts.

    Marginal between the shortest and the longest third (medians), so fixed per-request
    costs (HTTP, scheduling, the hand-off) cancel; the longest third's plain ratio when the
    lengths are too close (< 2x apart) or the times do not grow.
    """
    t, s = np.asarray(tokens, float), np.asarray(seconds, float)
    keep = (t > 0) & (s > 0)
    t, s = t[keep], s[keep]
    if not len(t):
        return None
    order = np.argsort(t)
    third = max(1, len(t) // 3)
    lo, hi = order[:third], order[-third:]
    n_lo, n_hi = float(np.median(t[lo])), float(np.median(t[hi]))
    s_lo, s_hi = float(np.median(s[lo])), float(np.median(s[hi]))
    if n_hi >= 2 * n_lo and s_hi > s_lo:
        return (shape.prefill_flops(n_hi) - shape.prefill_flops(n_lo)) / (s_hi - s_lo)
    return float(np.median([shape.prefill_flops(t[i]) / s[i] for i in hi]))


def plateau_bandwidth(
    nbytes: np.ndarray, seconds: np.ndarray, alpha_s: float = 0.0
) -> float | None:
    """Median bytes/s of the largest third of the transfers, their latency ``alpha_s`` off."""
    b, s = np.asarray(nbytes, float), np.asarray(seconds, float) - alpha_s
    keep = (b > 0) & (s > 0)
    b, s = b[keep], s[keep]
    if not len(b):
        return None
    top = np.argsort(b)[-max(1, len(b) // 3) :]
    return float(np.median(b[top] / s[top]))


def relative_gap(pred: Prediction, measured: float | None) -> float | None:
    """(predicted - measured) / measured when both cross."""
    if pred.shape is Shape.CROSSING and measured:
        return (pred.tokens - measured) / measured
    return None


def rms_error_ms(saving: Saving | None, x: np.ndarray, saving_ms: np.ndarray) -> float | None:
    """RMS of predicted minus measured TTFT saving (ms) at history lengths ``x``."""
    if saving is None or not len(x):
        return None
    pred_ms = saving(np.asarray(x, float)) * 1e3
    return float(np.sqrt(np.mean((pred_ms - np.asarray(saving_ms, float)) ** 2)))
