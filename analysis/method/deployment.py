"""Everything measured and fitted for one deployment (pure), computed once per run.

The measured comparison (``pull_recompute.measure``: per-length savings, the crossover
with its interval, the A/A control), the cost fits (``fits``), the two predictions
(``predict``) and the ``kv_recompute_threshold`` recommendation. The questions
(``analysis/questions/``) read it through ``Context``.

The threshold is recommended only from a decided verdict: the crossover rounded up to the
block size (with its interval, rounded the same way); the shortest measured length when
pull was faster at every one; none when recompute was. Otherwise "not determined".

Loads: where a deployment's Points ran at more than one concurrency (``workload.
concurrency=[...]``), the crossover, its A/A control, the threshold and the prediction from
P's spent costs (``spent_cost``) are computed per load (``LoadAnalysis``), never pooled;
the deployment's own ``measured`` then holds every load's cells but no crossover.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.load.runs import RunData, deployment_label
from analysis.method import predict, samples
from analysis.method.fits import POOR_R2, RecomputeFit, TransferFit, fit_recompute, fit_transfer
from analysis.method.model_cost import ModelShape
from analysis.method.pairs import request_frame
from analysis.method.pull_recompute import Measured, measure
from analysis.method.saving_curve import Shape, crossover
from analysis.method.spent_cost import Check, SpentCosts, check, fit_spent, spent_frame
from analysis.method.stats import Status


def _round_up(tokens: float, block: int) -> int:
    return int(math.ceil(max(tokens, 0.0) / block) * block)


@dataclass(frozen=True)
class ThresholdAdvice:
    """A ``kv_recompute_threshold`` to set (None: never pull / not determined) and why."""

    value: int | None
    status: Status
    why: str
    low: int | None = None
    high: int | None = None

    def text(self) -> str:
        if self.status is not Status.DECIDED:
            return f"not determined ({self.why})"
        if self.value is None:
            return f"none: {self.why}"
        return f"{self.text_short()} ({self.why})"

    def text_short(self) -> str:
        """``128 tokens, 95% CI [96, 160]``; a side left open is said so (``>= 96``)."""
        if self.value is None:
            return "none"
        if self.low is None and self.high is None:
            return f"{self.value:,} tokens"
        if self.high is None:
            return f"{self.value:,} tokens, 95% CI >= {self.low:,} (no upper bound)"
        if self.low is None:
            return f"{self.value:,} tokens, 95% CI <= {self.high:,}"
        return f"{self.value:,} tokens, 95% CI [{self.low:,}, {self.high:,}]"

    def to_dict(self) -> dict:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "status": self.status.value,
            "why": self.why,
            "text": self.text(),
        }


def advise_threshold(m: Measured, block_size: int) -> ThresholdAdvice:
    c = m.crossover
    block = max(1, int(block_size or 1))
    if not c.decided:
        why = {
            Status.INCONCLUSIVE: "the crossover is inconclusive",
            Status.UNDETERMINED: "the crossover has no interval",
        }.get(c.status, "")
        return ThresholdAdvice(None, c.status, why or c.reason or "no crossover measured")
    if c.shape is Shape.CROSSING:
        lo = _round_up(c.low, block) if c.low is not None else None
        hi = _round_up(c.high, block) if c.high is not None else None
        value = _round_up(c.estimate if c.estimate is not None else c.low, block)
        return ThresholdAdvice(value, Status.DECIDED, "measured crossover", lo, hi)
    if c.shape is Shape.PULL_EVERYWHERE:
        floor = int(c.lo // block * block)
        why = "pull was faster at every measured length: the shortest, rounded down"
        return ThresholdAdvice(floor, Status.DECIDED, why, None, floor)
    if c.shape is Shape.RECOMPUTE_EVERYWHERE:
        why = (
            f"do not pull (recompute was faster at every measured length, up to {c.hi:,.0f} tokens)"
        )
        return ThresholdAdvice(None, Status.DECIDED, why)
    # pull faster only below a length, or the sign changes more than once: a threshold pulls
    # every history from a length on, so no value of it follows the measured saving
    why = (
        f"{c.describe()}; kv_recompute_threshold pulls every history from a length on, "
        "so no value of it matches this"
    )
    return ThresholdAdvice(None, Status.DECIDED, why)


@dataclass
class LoadAnalysis:
    """One offered load of a deployment: its crossover, control, threshold and prediction."""

    concurrency: int | None  # None: the Points name none
    measured: Measured
    threshold_advice: ThresholdAdvice
    spent: SpentCosts  # P's spent costs at this load and the crossover they predict
    check: Check  # the prediction against the measured crossover
    point_ids: frozenset[str] = frozenset()  # its Points (empty: the deployment's every one)

    def requests(self, req: pd.DataFrame) -> pd.DataFrame:
        """``req``'s rows of this load's Points."""
        return req[req["point_id"].isin(self.point_ids)] if self.point_ids else req

    @property
    def name(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency is not None else ""


@dataclass
class DeploymentAnalysis:
    deployment_id: str
    label: str
    model: str
    transport: str
    block_size: int
    shape: ModelShape | None
    transfer_bytes_per_token: float | None  # what one transfer moves per token
    measured: Measured
    recompute_samples: pd.DataFrame
    transfer_samples: pd.DataFrame
    transfer_source: str
    transfer_lent_by: str  # the run dir whose transfer-bench records the fits used ("": own)
    recompute_fit: RecomputeFit | None
    transfer_fit: TransferFit | None
    flops_per_s: float | None
    bandwidth_bytes_per_s: float | None
    by_fit: predict.Prediction
    by_first_principles: predict.Prediction
    fit_vs_measured: float | None
    fp_vs_measured: float | None
    fit_rms_ms: float | None  # RMS of predicted - measured saving at the measured lengths
    fp_rms_ms: float | None
    threshold_advice: ThresholdAdvice
    notes: list[str] = field(default_factory=list)
    loads: list[LoadAnalysis] = field(default_factory=list)  # one per concurrency
    pull_cost: SpentCosts | None = None  # P's spent costs over every load together
    placement: str = ""  # the topology's placement (same_node / cross_node)
    hosts: dict[str, str] = field(default_factory=dict)  # instance -> "hostname (address)"

    @property
    def per_load(self) -> bool:
        """Several loads: every crossover is per load (``loads``), none pooled."""
        return len(self.loads) > 1

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


def _fit_notes(rfit: RecomputeFit | None, tfit: TransferFit | None, source: str) -> list[str]:
    notes = []
    if rfit is None:
        notes.append("recompute fit: fewer than two distinct prompt lengths computed")
    elif not rfit.predicts:
        notes.append(f"recompute fit: {rfit.df} degrees of freedom: no prediction from it")
    elif not rfit.quality.r2 >= POOR_R2:
        notes.append(
            f"recompute fit is poor (R² {rfit.quality.r2:.2f}): TTFT does not follow the prompt "
            "length here (overheads dominate?); predictions from it are unreliable"
        )
    if tfit is None:
        notes.append(f"transfer fit: {samples.NO_TRANSFER_SAMPLES}")
    elif not tfit.predicts:
        notes.append(f"transfer fit ({source}): {tfit.why_not()}: no prediction from it")
    elif not tfit.quality.r2 >= POOR_R2:
        notes.append(
            f"transfer fit is poor (R² {tfit.quality.r2:.2f}): transfer time does not follow "
            "the size here; predictions from it are unreliable"
        )
    return notes


def bench_for(data: RunData, pts: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The transfer-bench records a deployment's fits may use, and who lends them: its own
    run dir's, else those of run dirs holding no Points (a transfer-bench run given for that,
    named in the prediction); never another measured run's."""
    bench = data.bench
    if not len(bench) or "run_dir" not in bench:
        return bench, ""
    own = set(pts["run_dir"])
    mine = bench[bench["run_dir"].isin(own)]
    if len(mine):
        return mine, ""
    measured = set(data.points["run_dir"]) if len(data.points) else set()
    lent = bench[~bench["run_dir"].isin(measured)]
    lenders = sorted(set(lent["run_dir"]))
    return lent, ", ".join(lenders)


def analyze_deployment(data: RunData, requests: pd.DataFrame, dep_id: str) -> DeploymentAnalysis:
    pts = data.points[data.points["deployment_id"] == dep_id]
    first = pts.iloc[0]
    notes: list[str] = []
    try:
        shape = ModelShape(**data.model_shape(dep_id).to_dict())
    except ValueError as exc:
        shape = None
        notes.append(f"first principles skipped: {exc}")
    flows = set(pts["flow"])
    pull_flow = "decode_first" if "decode_first" in flows and "pull" not in flows else "pull"
    block = first["block_size"]
    block = int(block) if block is not None and not pd.isna(block) else 16
    loads = analyze_loads(data, requests, pts, dep_id, pull_flow, block)
    measured = loads[0].measured if len(loads) == 1 else pooled_cells(loads)
    rec = samples.recompute_samples(data.turns, dep_id)
    per_xfer = predict.transfer_bytes_per_token(shape, first["d_tp"]) if shape else None
    bench, lender = bench_for(data, pts)
    xfer, source = samples.transfer_samples(
        data.traces,
        bench,
        dep_id,
        first["tp_pair"],
        first["model"],
        str(first["ucx_tls"] or ""),
        per_xfer,
    )
    if lender and source.startswith(samples.BENCH_SOURCE):
        source = f"{source} of {lender}"
    else:
        lender = ""
    rfit = fit_recompute(rec["tokens"], rec["ttft_s"], rec["point_id"]) if len(rec) else None
    tfit = (
        fit_transfer(xfer["bytes"], xfer["seconds"], source, xfer["cluster"]) if len(xfer) else None
    )
    notes += _fit_notes(rfit, tfit, source)
    usable = rfit and rfit.predicts and tfit and tfit.predicts
    fit_fn = predict.fit_saving(rfit, tfit, per_xfer) if usable and per_xfer else None
    by_fit = (
        predict.predicted_crossover(fit_fn)
        if fit_fn
        else predict.none(
            _lacking(
                {
                    "recompute fit": rfit and rfit.predicts,
                    "transfer fit": tfit and tfit.predicts,
                    "model shape": shape,
                }
            )
        )
    )
    flops = (
        predict.effective_flops(shape, rec["tokens"], rec["ttft_s"]) if shape and len(rec) else None
    )
    alpha = tfit.alpha_s if tfit else 0.0
    bw = predict.plateau_bandwidth(xfer["bytes"], xfer["seconds"], alpha) if len(xfer) else None
    fp_fn = (
        predict.first_principles_saving(shape, flops, bw, alpha, per_xfer)
        if shape and flops and bw
        else None
    )
    by_fp = (
        predict.predicted_crossover(fp_fn)
        if fp_fn
        else predict.none(_lacking({"prefill rate": flops, "bandwidth": bw, "model shape": shape}))
    )
    failed = pts[pts["status"] != "ok"]
    if len(failed):
        notes.append(f"{len(failed)} of {len(pts)} Points failed and are left out")
    cells = measured.cells
    x = [c.x for c in cells]
    saving = [c.saving.estimate for c in cells]
    est = measured.crossover.estimate
    return DeploymentAnalysis(
        deployment_id=dep_id,
        label=deployment_label(dep_id, data.points),
        model=str(first["model"]),
        transport=str(first["transport"]),
        block_size=block,
        shape=shape,
        transfer_bytes_per_token=per_xfer,
        measured=measured,
        recompute_samples=rec,
        transfer_samples=xfer,
        transfer_source=source,
        transfer_lent_by=lender,
        recompute_fit=rfit,
        transfer_fit=tfit,
        flops_per_s=flops,
        bandwidth_bytes_per_s=bw,
        by_fit=by_fit,
        by_first_principles=by_fp,
        fit_vs_measured=predict.relative_gap(by_fit, est),
        fp_vs_measured=predict.relative_gap(by_fp, est),
        fit_rms_ms=predict.rms_error_ms(fit_fn, x, saving),
        fp_rms_ms=predict.rms_error_ms(fp_fn, x, saving),
        threshold_advice=loads[0].threshold_advice if len(loads) == 1 else PER_LOAD,
        notes=notes,
        loads=loads,
        pull_cost=loads[0].spent
        if len(loads) == 1
        else fit_spent(spent_frame(data.requests, _ok_ids(pts), pull_flow)),
        placement=str(first["placement"] or ""),
        hosts=_hosts(pts),
    )


PER_LOAD = ThresholdAdvice(None, Status.UNDETERMINED, "one per load: see each")


def concurrencies(pts: pd.DataFrame) -> list[int]:
    """The distinct concurrencies a deployment's Points ran at (none named: empty)."""
    if "concurrency" not in pts or not len(pts):
        return []
    return sorted({int(c) for c in pts["concurrency"].dropna().unique()})


def _ok_ids(pts: pd.DataFrame) -> set[str]:
    return set(pts.loc[pts["status"] == "ok", "point_id"])


def _hosts(pts: pd.DataFrame) -> dict[str, str]:
    """Where the instances ran, from the first Point that recorded it ({} if none did)."""
    for text in pts["hosts"]:  # a points frame has every POINT_COLUMNS column
        try:
            hosts = json.loads(str(text or "{}"))
        except json.JSONDecodeError:
            continue
        if isinstance(hosts, dict) and hosts:
            return hosts
    return {}


def analyze_loads(
    data: RunData, requests: pd.DataFrame, pts: pd.DataFrame, dep_id: str, pull_flow: str,
    block: int,
) -> list[LoadAnalysis]:  # fmt: skip
    """One ``LoadAnalysis`` per concurrency (one, of every Point, when fewer than two)."""
    levels = concurrencies(pts)
    groups: list[tuple[int | None, pd.DataFrame]] = (
        [(c, pts[pts["concurrency"] == c]) for c in levels]
        if len(levels) > 1
        else [(levels[0] if levels else None, pts)]
    )
    out = []
    for conc, mine in groups:
        ids = _ok_ids(mine)
        req = (
            requests[requests["point_id"].isin(set(mine["point_id"]))]
            if len(levels) > 1
            else requests
        )
        m = measure(req, dep_id, pull_flow)
        spent = fit_spent(spent_frame(data.requests, ids, pull_flow), conc)
        out.append(
            LoadAnalysis(conc, m, advise_threshold(m, block), spent, check(spent, m.crossover))
        )
    return out


def pooled_cells(loads: list[LoadAnalysis]) -> Measured:
    """Every load's cells (their kinds name the load) with no crossover of them pooled."""
    cells = [c for load in loads for c in load.measured.cells]
    why = f"measured per load ({len(loads)} concurrencies): see each"
    frames = [load.measured.pairs for load in loads if len(load.measured.pairs)]
    pairs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return Measured(cells=cells, crossover=crossover(None, why), pairs=pairs)


@dataclass
class Context:
    """What every question reads: the loaded run, its requests, and each deployment's
    analysis (computed on first use, then kept)."""

    data: RunData
    requests: pd.DataFrame
    _cache: dict[str, DeploymentAnalysis] = field(default_factory=dict)
    # goodput's bounds given to the analysis (--slo-ttft-ms, --slo-tpot-ms): they replace the
    # runs' own slo.* ({}: the runs')
    slo: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, data: RunData) -> Context:
        return cls(data, request_frame(data))

    def deployment(self, dep_id: str) -> DeploymentAnalysis:
        if dep_id not in self._cache:
            self._cache[dep_id] = analyze_deployment(self.data, self.requests, dep_id)
        return self._cache[dep_id]

    def deployments(self) -> list[DeploymentAnalysis]:
        """One per deployment with at least one Point, by id."""
        pts = self.data.points
        if not len(pts):
            return []
        return [self.deployment(d) for d in sorted(pts["deployment_id"].unique())]
