"""The history length above which pulling the KV beats recomputing it, per deployment.

Three answers, side by side:

- measured: where ``TTFT(recompute) - TTFT(pull)`` (turns >= 2) turns positive, linearly
  interpolated between the two swept lengths around the last sign change;
- predicted from the fits: computing ``h`` history tokens costs ``c1 h + c2 h^2`` more than
  not computing them (``c0`` and the new tokens' own cost cancel; so does their attention
  to the history: ``c2 (u + h)^2 - c2 (u^2 + 2 u h) = c2 h^2``); pulling costs
  ``alpha + h * kv_bytes_per_token / beta``;
- predicted from first principles: the FLOPs of those ``h`` tokens (``model_cost``) at the
  measured prefill rate (marginal FLOP/s of the recompute prompts) against their KV bytes at
  the measured bandwidth (median of the largest third of the transfers, the fitted
  ``alpha`` taken off each) plus ``alpha``.

Both predictions assume D keeps the history in its prefix cache in both flows, so the P->D
hand-off of the new tokens is common to both and only "compute h vs pull h" differs. Bytes
are per transfer: a transfer moves one D rank's KV heads (``transfer_bytes_per_token``),
as the bench records and traces count them, and the D ranks' transfers run side by side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis import samples
from analysis.fits import RecomputeFit, TransferFit, fit_recompute, fit_transfer
from analysis.load import RunData, deployment_label
from analysis.model_cost import ModelShape

MAX_TOKENS = 1 << 20  # the range searched for predicted crossovers
POOR_R2 = 0.5  # a fit below this gets a note

CROSSING = "crossing"
PULL_EVERYWHERE = "pull_faster_everywhere"
RECOMPUTE_EVERYWHERE = "recompute_faster_everywhere"
NO_DATA = "no_data"


@dataclass
class Crossover:
    tokens: float | None  # None unless status is ``crossing``
    status: str
    lo: float | None = None  # the range looked at
    hi: float | None = None
    sign_changes: int = 0
    reason: str = ""  # why there is no data

    def describe(self) -> str:
        if self.status == CROSSING:
            extra = f" ({self.sign_changes} sign changes: noisy)" if self.sign_changes > 1 else ""
            return f"{self.tokens:,.0f} tokens{extra}"
        if self.status == PULL_EVERYWHERE:
            if self.lo is not None and self.lo <= 1:
                return "none: pull faster at every length"
            return f"none in range: pull faster from {self.lo:,.0f} tokens on"
        if self.status == RECOMPUTE_EVERYWHERE:
            return f"none in range: recompute faster up to {self.hi:,.0f} tokens"
        return f"n/a ({self.reason or 'no data'})"


def measured_crossover(xs: np.ndarray, diffs: np.ndarray) -> Crossover:
    """``diffs`` = TTFT(recompute) - TTFT(pull) at history lengths ``xs`` (any order)."""
    x = np.asarray(xs, dtype=float)
    d = np.asarray(diffs, dtype=float)
    keep = np.isfinite(x) & np.isfinite(d)
    x, d = x[keep], d[keep]
    if len(x) == 0:
        return Crossover(None, NO_DATA, reason="no pull/recompute pairs at turns >= 2")
    frame = pd.DataFrame({"x": x, "d": d}).groupby("x", as_index=False)["d"].mean()
    x, d = frame["x"].to_numpy(), frame["d"].to_numpy()
    lo, hi = float(x[0]), float(x[-1])
    changes = int(np.sum(np.diff(np.sign(d)) != 0))
    not_faster = np.nonzero(d <= 0)[0]
    if len(not_faster) == 0:
        return Crossover(None, PULL_EVERYWHERE, lo, hi, changes)
    i = int(not_faster[-1])
    if i == len(x) - 1:
        return Crossover(None, RECOMPUTE_EVERYWHERE, lo, hi, changes)
    x0, x1, d0, d1 = x[i], x[i + 1], d[i], d[i + 1]
    tokens = x0 + (0.0 - d0) * (x1 - x0) / (d1 - d0)
    return Crossover(float(tokens), CROSSING, lo, hi, changes)


Saving = Callable[[np.ndarray], np.ndarray]  # seconds recompute - pull at history h


def predicted_crossover(saving: Saving, max_tokens: float = MAX_TOKENS) -> Crossover:
    """Where ``saving(h)`` turns positive for good, searched over 1 .. ``max_tokens``."""
    h = np.geomspace(1.0, max_tokens, 4000)
    s = saving(h)
    changes = int(np.sum(np.diff(np.sign(s)) != 0))
    not_faster = np.nonzero(s <= 0)[0]
    if len(not_faster) == 0:
        return Crossover(None, PULL_EVERYWHERE, 1.0, max_tokens, changes)
    i = int(not_faster[-1])
    if i == len(h) - 1:
        return Crossover(None, RECOMPUTE_EVERYWHERE, 1.0, max_tokens, changes)
    a, b = h[i], h[i + 1]
    for _ in range(60):
        mid = 0.5 * (a + b)
        if saving(np.array([mid]))[0] <= 0:
            a = mid
        else:
            b = mid
    return Crossover(float(b), CROSSING, 1.0, max_tokens, changes)


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


def relative_gap(pred: Crossover, meas: Crossover) -> float | None:
    """(predicted - measured) / measured when both cross."""
    if pred.status == CROSSING and meas.status == CROSSING and meas.tokens:
        return (pred.tokens - meas.tokens) / meas.tokens
    return None


def rms_error_ms(saving: Saving | None, pairs: pd.DataFrame) -> float | None:
    """RMS of predicted minus measured TTFT saving over the measured pairs."""
    if saving is None or not len(pairs):
        return None
    pred_ms = saving(pairs["x"].to_numpy(float)) * 1e3
    return float(np.sqrt(np.mean((pred_ms - pairs["diff_ms"].to_numpy(float)) ** 2)))


def _round_up(tokens: float, block: int) -> int:
    return int(math.ceil(max(tokens, 0.0) / block) * block)


def recommend_threshold(
    measured: Crossover, by_fit: Crossover, by_fp: Crossover, block_size: int
) -> tuple[int | None, str]:
    """A ``kv_recompute_threshold`` (tokens, a block multiple) and why; None: never pull."""
    block = max(1, int(block_size or 1))
    if measured.status == CROSSING:
        return _round_up(measured.tokens, block), "measured crossover"
    if measured.status == PULL_EVERYWHERE:
        if by_fit.status == CROSSING and by_fit.tokens <= measured.lo:
            return _round_up(by_fit.tokens, block), "fit crossover, below the measured range"
        floor = int(measured.lo // block * block)
        return floor, "pull won at every measured length: the shortest one, rounded down"
    if measured.status == RECOMPUTE_EVERYWHERE:
        if by_fit.status == CROSSING and by_fit.tokens >= measured.hi:
            return _round_up(by_fit.tokens, block), "fit crossover, above the measured range"
        return None, "recompute won at every measured length: do not pull (threshold > max len)"
    for pred, name in ((by_fit, "fits"), (by_fp, "first principles")):
        if pred.status == CROSSING:
            return _round_up(pred.tokens, block), f"predicted ({name}); nothing measured"
        if pred.status == PULL_EVERYWHERE:
            return 0, f"predicted ({name}): pull always faster; nothing measured"
    return None, "no pull/recompute measurements and no prediction"


@dataclass
class DeploymentAnalysis:
    deployment_id: str
    label: str
    model: str
    transport: str
    tp_pair: str
    threshold: Any
    block_size: int
    new_tokens: int  # per turn >= 2: previous output + new user message
    shape: ModelShape | None
    transfer_bytes_per_token: float | None  # what one transfer moves per token
    pairs: pd.DataFrame
    recompute_samples: pd.DataFrame
    transfer_samples: pd.DataFrame
    transfer_source: str
    recompute_fit: RecomputeFit | None
    transfer_fit: TransferFit | None
    flops_per_s: float | None
    bandwidth_bytes_per_s: float | None
    measured: Crossover
    by_fit: Crossover
    by_first_principles: Crossover
    fit_vs_measured: float | None
    fp_vs_measured: float | None
    fit_rms_ms: float | None
    fp_rms_ms: float | None
    recommended_threshold: int | None
    recommendation: str
    notes: list[str] = field(default_factory=list)

    @property
    def kv_bytes_per_token(self) -> int | None:
        return self.shape.kv_bytes_per_token if self.shape else None

    @property
    def prefill_tok_s(self) -> float | None:
        """The measured FLOP/s as tokens/s of a short prompt."""
        if self.shape is None or not self.flops_per_s:
            return None
        return self.flops_per_s / self.shape.flops_per_token(0.0)


def _lacking(parts: dict[str, Any]) -> str:
    """``{"transfer fit": None, ...}`` -> ``"no transfer fit"``."""
    return "no " + ", no ".join(name for name, value in parts.items() if not value)


def analyze_deployment(data: RunData, dep_id: str) -> DeploymentAnalysis:
    pts = data.points[data.points["deployment_id"] == dep_id]
    first = pts.iloc[0]
    notes: list[str] = []
    dep = data.deployments.get(dep_id, {})
    try:
        shape = ModelShape.from_dict(dep.get("model") or {})
    except ValueError as exc:
        shape = None
        notes.append(f"first principles skipped: {exc}")
    pairs = samples.paired(data.turns, dep_id, "pull")
    rec = samples.recompute_samples(data.turns, dep_id)
    per_xfer = transfer_bytes_per_token(shape, first["d_tp"]) if shape else None
    xfer, source = samples.transfer_samples(
        data.traces,
        data.bench,
        data.points,
        dep_id,
        first["tp_pair"],
        first["model"],
        str(first.get("ucx_tls", "") or ""),
        per_xfer,
    )
    rfit = fit_recompute(rec["tokens"], rec["ttft_s"]) if len(rec) else None
    tfit = fit_transfer(xfer["bytes"], xfer["seconds"], source) if len(xfer) else None
    if rfit is None:
        notes.append("recompute fit: fewer than two distinct prompt lengths computed")
    elif not rfit.quality.r2 >= POOR_R2:
        notes.append(
            f"recompute fit is poor (R² {rfit.quality.r2:.2f}): TTFT does not follow the prompt "
            "length here (overheads dominate?); predictions from it are unreliable"
        )
    if tfit is None:
        notes.append("transfer fit: no traces, bench records or pull totals with two sizes")
    elif not tfit.quality.r2 >= POOR_R2:
        notes.append(
            f"transfer fit is poor (R² {tfit.quality.r2:.2f}): transfer time does not follow "
            "the size here; predictions from it are unreliable"
        )
    measured = measured_crossover(pairs["x"].to_numpy(), pairs["diff_ms"].to_numpy())
    flows = set(pts["flow"])
    if measured.status == NO_DATA and not {"pull", "recompute"} <= flows:
        measured.reason = "needs both the pull and the recompute flow"
    fit_fn = fit_saving(rfit, tfit, per_xfer) if rfit and tfit and per_xfer else None
    by_fit = (
        predicted_crossover(fit_fn)
        if fit_fn
        else Crossover(
            None,
            NO_DATA,
            reason=_lacking({"recompute fit": rfit, "transfer fit": tfit, "model shape": shape}),
        )
    )
    flops = effective_flops(shape, rec["tokens"], rec["ttft_s"]) if shape and len(rec) else None
    alpha = tfit.alpha_s if tfit else 0.0
    bw = plateau_bandwidth(xfer["bytes"], xfer["seconds"], alpha) if len(xfer) else None
    fp_fn = first_principles_saving(shape, flops, bw, alpha) if shape and flops and bw else None
    by_fp = (
        predicted_crossover(fp_fn)
        if fp_fn
        else Crossover(
            None,
            NO_DATA,
            reason=_lacking({"prefill rate": flops, "bandwidth": bw, "model shape": shape}),
        )
    )
    block = first["block_size"]
    block = int(block) if block is not None and not pd.isna(block) else 16
    thr, why = recommend_threshold(measured, by_fit, by_fp, block)
    failed = pts[pts["status"] != "ok"]
    if len(failed):
        notes.append(f"{len(failed)} of {len(pts)} Points failed and are left out")
    return DeploymentAnalysis(
        deployment_id=dep_id,
        label=deployment_label(dep_id, data.points),
        model=str(first["model"]),
        transport=str(first["transport"]),
        tp_pair=str(first["tp_pair"]),
        threshold=None if pd.isna(first["threshold"]) else first["threshold"],
        block_size=block,
        new_tokens=int((first["user_tokens"] or 0) + (first["output_tokens"] or 0)),
        shape=shape,
        transfer_bytes_per_token=per_xfer,
        pairs=pairs,
        recompute_samples=rec,
        transfer_samples=xfer,
        transfer_source=source,
        recompute_fit=rfit,
        transfer_fit=tfit,
        flops_per_s=flops,
        bandwidth_bytes_per_s=bw,
        measured=measured,
        by_fit=by_fit,
        by_first_principles=by_fp,
        fit_vs_measured=relative_gap(by_fit, measured),
        fp_vs_measured=relative_gap(by_fp, measured),
        fit_rms_ms=rms_error_ms(fit_fn, pairs),
        fp_rms_ms=rms_error_ms(fp_fn, pairs),
        recommended_threshold=thr,
        recommendation=why,
        notes=notes,
    )


def analyze(data: RunData) -> list[DeploymentAnalysis]:
    """One analysis per deployment that has at least one Point."""
    if not len(data.points):
        return []
    return [analyze_deployment(data, d) for d in sorted(data.points["deployment_id"].unique())]
