"""What the requests measured, pull against recompute, in one deployment (pure).

- **cells**: per (workload kind, swept history length, turn >= 2), the paired saving
  ``TTFT(recompute) - TTFT(pull)`` of the same conversation's same turn, averaged per
  repetition, with its 95% interval over the repetitions (``stats.mean_verdict``);
- **curve** and **crossover**: ``saving_curve`` over every wave of turns >= 2;
- **control**: turn 1 is identical work in both flows (nothing cached to pull yet): the
  same paired difference there is an A/A control. It should be 0; the run is flagged
  invalid when its interval excludes 0 (the flows are not measured alike: order, warm-up,
  a stall) or when it is more than half the largest decided effect.

Positive savings mean pull is faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.pairs import CLUSTER, STRATUM, cluster_index, paired, waves
from analysis.saving_curve import Crossover, SavingCurve, crossover, fit_curve
from analysis.stats import Status, Verdict, linear_interval, mean_verdict, verdicts

CONTROL_SHARE = 0.5  # a control above this share of the effect invalidates the run


@dataclass(frozen=True)
class Cell:
    kind: str
    history: int  # swept length (the Point's)
    turn: int
    x: float  # mean history tokens at this turn
    recompute_ms: float  # mean TTFT
    pull_ms: float
    saving: Verdict  # recompute - pull, ms

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "history_tokens": self.history,
            "turn": self.turn,
            "x": self.x,
            "ttft_recompute_ms": self.recompute_ms,
            "ttft_pull_ms": self.pull_ms,
            "saving": self.saving.to_dict(),
        }


@dataclass(frozen=True)
class Control:
    """Turn 1, pull - recompute (ms and relative to the turn's mean TTFT)."""

    diff: Verdict  # pull - recompute, ms
    level_ms: float  # mean turn-1 TTFT of both flows
    effect: Verdict | None  # the largest decided saving it is compared with
    invalid: bool
    reason: str

    @property
    def relative(self) -> float:
        return self.diff.estimate / self.level_ms if self.level_ms else math.nan

    def line(self) -> str:
        d = self.diff
        rel = f" ({self.relative:+.0%} of {self.level_ms:,.0f} ms)" if self.level_ms else ""
        head = f"A/A control (turn 1, identical work): pull - recompute {d.interval()}{rel}"
        if d.status is Status.UNDETERMINED:
            return f"{head}: not checked ({d.why()})"
        if self.invalid:
            return f"{head}: INVALID RUN: {self.reason}"
        return f"{head}: passes ({self.reason})"

    def to_dict(self) -> dict:
        return {
            "pull_minus_recompute": self.diff.to_dict(),
            "level_ms": self.level_ms,
            "relative": self.relative,
            "effect": self.effect.to_dict() if self.effect else None,
            "invalid": self.invalid,
            "reason": self.reason,
            "text": self.line(),
        }


@dataclass
class Measured:
    cells: list[Cell] = field(default_factory=list)
    curve: SavingCurve | None = None
    crossover: Crossover = field(default_factory=lambda: crossover(None))
    control: Control | None = None
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)  # turns >= 2, request level

    @property
    def largest_effect(self) -> Verdict | None:
        decided = [c.saving for c in self.cells if c.saving.decided]
        return max(decided, key=lambda v: abs(v.estimate)) if decided else None


def wave_weights(w: pd.DataFrame) -> np.ndarray:
    """``1 / level^2`` with ``level`` the mean TTFT of both flows at the wave's (stratum,
    turn) over its repetitions (``saving_curve``'s docstring)."""
    level = w.groupby([*STRATUM, "turn"])["level_ms"].transform("mean").to_numpy(float)
    return 1.0 / np.maximum(level, 1e-9) ** 2


def fit_waves(w: pd.DataFrame, requests: int) -> SavingCurve | None:
    """The saving curve of these waves (clusters: repetitions, strata: history lengths)."""
    if not len(w):
        return None
    cl, st = cluster_index(w, CLUSTER, STRATUM)
    return fit_curve(
        w["x"].to_numpy(float), w["d_ms"].to_numpy(float), wave_weights(w), cl, st, requests
    )


def _cells(later: pd.DataFrame, w: pd.DataFrame) -> list[Cell]:
    by = ["kind", "h", "turn"]
    means = later.groupby(by)[["a_ms", "b_ms"]].agg(["mean", "size"])
    out = []
    for (kind, h, turn), g in w.groupby(by, sort=True):
        m = means.loc[(kind, h, turn)]
        n = int(m[("a_ms", "size")])
        v = mean_verdict(g["d_ms"].to_numpy(float), requests=n)
        x = float(g["x"].mean())
        out.append(
            Cell(str(kind), int(h), int(turn), x, m[("a_ms", "mean")], m[("b_ms", "mean")], v)
        )
    return out


def control(first: pd.DataFrame, effect: Verdict | None) -> Control | None:
    """Turn-1 pairs (``paired(req, "pull", "recompute")``) -> the A/A control."""
    if not len(first):
        return None
    w = waves(first, CLUSTER)
    _, st = cluster_index(w, CLUSTER, STRATUM)
    n = len(w)
    spread = linear_interval((w["d_ms"].to_numpy(float) / n)[:, None], st)
    sizes = np.bincount(st)
    (diff,) = verdicts(spread, int(sizes.min()), len(first))
    level = float(first["level_ms"].mean())
    if diff.status is Status.UNDETERMINED:
        return Control(diff, level, effect, False, diff.why())
    if diff.decided:
        why = "its 95% interval excludes 0: the flows were not measured alike"
        return Control(diff, level, effect, True, why)
    if effect is not None and abs(diff.estimate) > CONTROL_SHARE * abs(effect.estimate):
        why = (
            f"|{diff.estimate:,.1f}| ms is more than half the largest measured effect "
            f"({effect.estimate:+,.1f} ms)"
        )
        return Control(diff, level, effect, True, why)
    what = "within its noise"
    if effect is not None:
        what += f", under half the largest effect ({effect.estimate:+,.1f} ms)"
    return Control(diff, level, effect, False, what)


def measure(req: pd.DataFrame, dep_id: str, pull_flow: str = "pull") -> Measured:
    """Everything above for one deployment, from ``pairs.request_frame`` rows."""
    mine = req[req["deployment_id"] == dep_id] if len(req) else req
    pairs = paired(mine, "recompute", pull_flow)
    if not len(pairs):
        flows = set(mine["flow"]) if len(mine) else set()
        missing = {"recompute", pull_flow} - flows
        why = f"needs both the {pull_flow} and the recompute flow" if missing else "no pairs"
        return Measured(crossover=crossover(None, why))
    later = pairs[pairs["turn"] >= 2]
    w = waves(later)
    curve = fit_waves(w, len(later))
    reason = "" if curve is not None else "fewer than two history lengths at turns >= 2"
    cells = _cells(later, w)
    out = Measured(cells, curve, crossover(curve, reason), None, later)
    first = paired(mine[mine["turn"] == 1], pull_flow, "recompute")
    out.control = control(first, out.largest_effect)
    return out


def flow_levels(req: pd.DataFrame, dep_id: str) -> pd.DataFrame:
    """Mean TTFT per (flow, kind, history length, turn) with its 95% interval over the
    repetitions: columns ``flow kind h turn x ttft_ms low high repetitions``."""
    cols = ["flow", "kind", "h", "turn", "x", "ttft_ms", "low", "high", "repetitions"]
    mine = req[req["deployment_id"] == dep_id] if len(req) else req
    if not len(mine):
        return pd.DataFrame(columns=cols)
    per_rep = mine.groupby(["flow", *CLUSTER, "turn"], as_index=False)[["x", "ttft_ms"]].mean()
    rows = []
    for (flow, kind, h, turn), g in per_rep.groupby(["flow", "kind", "h", "turn"]):
        v = mean_verdict(g["ttft_ms"].to_numpy(float))
        rows.append([flow, kind, h, turn, g["x"].mean(), v.estimate, v.low, v.high, len(g)])
    return pd.DataFrame(rows, columns=cols)


def paired_difference(
    left: pd.DataFrame,
    right: pd.DataFrame,
    key: list[str],
    relative: bool = False,
    cluster: list[str] | None = None,
    stratum: list[str] | None = None,
) -> Verdict:
    """``left - right`` TTFT (ms) of requests paired on ``key``, or their ratio
    (``relative``: ``exp(mean log(left / right)) - 1`` in %), averaged per repetition
    (``cluster``), each repetition weighing the same, strata: ``stratum``."""
    cluster = [c for c in CLUSTER if c in key] if cluster is None else cluster
    stratum = [c for c in STRATUM if c in key] if stratum is None else stratum
    unit = "%" if relative else "ms"
    if not len(left) or not len(right):
        return mean_verdict(np.array([]), unit)
    lf = left.groupby(key, as_index=False)["ttft_ms"].mean()
    rt = right.groupby(key, as_index=False)["ttft_ms"].mean()
    m = lf.merge(rt, on=key, suffixes=("_a", "_b"))
    m = m[(m["ttft_ms_a"] > 0) & (m["ttft_ms_b"] > 0)] if relative else m
    if not len(m):
        return mean_verdict(np.array([]), unit)
    d = np.log(m["ttft_ms_a"] / m["ttft_ms_b"]) if relative else m["ttft_ms_a"] - m["ttft_ms_b"]
    per = m.assign(d=d).groupby(cluster, as_index=False)["d"].mean()
    _, st = cluster_index(per, cluster, stratum)
    spread = linear_interval((per["d"].to_numpy(float) / len(per))[:, None], st)
    (v,) = verdicts(spread, int(np.bincount(st).min()), len(m), unit)
    return as_percent(v) if relative else v


def as_percent(v: Verdict) -> Verdict:
    """A verdict on a mean log ratio as a relative change in % (monotone: same decision)."""

    def pc(x: float) -> float:
        return 100.0 * math.expm1(x) if np.isfinite(x) else math.nan

    return Verdict(
        pc(v.estimate),
        pc(v.low),
        pc(v.high),
        v.se,
        v.df,
        v.repetitions,
        v.requests,
        v.status,
        "%",
        v.more_repetitions,
    )


def level(req: pd.DataFrame) -> Verdict:
    """Mean TTFT of these requests, each repetition weighing the same, with its interval."""
    per = req.groupby(CLUSTER, as_index=False)["ttft_ms"].mean() if len(req) else req
    if not len(per):
        return mean_verdict(np.array([]))
    _, st = cluster_index(per, CLUSTER, STRATUM)
    spread = linear_interval((per["ttft_ms"].to_numpy(float) / len(per))[:, None], st)
    return verdicts(spread, int(np.bincount(st).min()), len(req))[0]
