"""What the requests measured, pull against recompute, in one deployment (pure).

- **cells**: per (workload kind, swept history length, turn >= 2), the paired saving
  ``TTFT(recompute) - TTFT(pull)`` of the same conversation's same turn, averaged per
  repetition, with its 95% interval over the repetitions (``stats.mean_verdict``);
- **curve** and **crossover**: ``saving_curve`` over every wave of turns >= 2;
- **control**: turn 1 is identical work in both flows (nothing cached to pull yet): the
  same paired difference there is an A/A control. It should be 0. The test is relative
  (each repetition's log ratio pull / recompute of its mean turn-1 TTFT, so a length's
  noise counts in proportion to its TTFT and a bias at short lengths is not drowned by the
  long ones) and per length band (the shorter and the longer half of the swept lengths,
  each length weighing the same within its band); the run is flagged invalid when a band's
  interval excludes 0 at the level that keeps the whole run's false-alarm rate at 5%:
  ``1 - 0.05 / (bands x deployments)`` (Bonferroni; ``Control.judged`` sets the number of
  deployments). The ms difference over every length (95%) is shown beside it.

Positive savings mean pull is faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from analysis.method.pairs import CLUSTER, STRATUM, cluster_index, paired, waves
from analysis.method.saving_curve import Crossover, SavingCurve, Shape, crossover, fit_curve
from analysis.method.stats import (
    LEVEL,
    Spread,
    Status,
    Verdict,
    linear_interval,
    mean_verdict,
    verdicts,
)

CONTROL_ALPHA = 0.05  # the A/A control's false-alarm rate per run, all bands and deployments
CONTROL_BLIND_PCT = 10.0  # a passing control whose interval reaches past this % says so


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
class ControlBand:
    """The turn-1 log ratio pull / recompute over the lengths ``lo`` .. ``hi``."""

    lo: int
    hi: int
    estimate: float  # mean log ratio, each length weighing the same
    se: float
    df: float
    repetitions: int  # the fewest of any of its lengths
    requests: int

    def verdict(self, level: float) -> Verdict:
        """Its ``level`` interval, as a relative difference in %."""
        spread = Spread(*(np.array([v], float) for v in (self.estimate, self.se, self.df)),
                        undetermined=np.array([self.repetitions < 2]))  # fmt: skip
        (v,) = verdicts(spread, self.repetitions, self.requests, "%", level)
        return as_percent(v)

    def lengths(self) -> str:
        return f"{self.lo:,}" if self.lo == self.hi else f"{self.lo:,}-{self.hi:,}"


@dataclass(frozen=True)
class Control:
    """Turn 1, pull against recompute: the ms difference over every length (95%, shown)
    and the relative test per length band that decides (``level``: its intervals')."""

    diff: Verdict  # pull - recompute, ms, every length, 95%
    level_ms: float  # mean turn-1 TTFT of both flows
    bands: tuple[ControlBand, ...] = ()
    family: int = 1  # controls tested in the run (deployments, or loads of one)
    invalid: bool = False
    reason: str = ""

    @property
    def relative(self) -> float:
        return self.diff.estimate / self.level_ms if self.level_ms else math.nan

    @property
    def level(self) -> float:
        """Each band's interval level: the run's 5% shared by every band and deployment."""
        return 1.0 - CONTROL_ALPHA / max(len(self.bands) * self.family, 1)

    def band_verdicts(self) -> list[Verdict]:
        return [b.verdict(self.level) for b in self.bands]

    def judged(self, family: int) -> Control:
        """The control tested as one of ``family`` deployments' (Bonferroni)."""
        c = replace(self, family=max(family, 1))
        checked = [(b, v) for b, v in zip(c.bands, c.band_verdicts(), strict=True)
                   if v.status is not Status.UNDETERMINED]  # fmt: skip
        if not checked:
            why = self.diff.why() if self.bands else "no repetitions to compare"
            return replace(c, invalid=False, reason=why)
        bad = [(b, v) for b, v in checked if v.decided]
        if bad:
            where = "; ".join(f"{v.interval('{:+.1f}')} at {b.lengths()} tokens" for b, v in bad)
            why = (
                f"pull / recompute differs beyond its {c.level:.2%} interval ({where}): "
                "the flows were not measured alike"
            )
            return replace(c, invalid=True, reason=why)
        widest = max(max(abs(v.low), abs(v.high)) for _, v in checked)
        if widest > CONTROL_BLIND_PCT:
            why = (
                f"within its noise, which is wide: a flow bias of up to ~{widest:.0f}% of TTFT "
                "would pass unseen; more repetitions narrow it"
            )
            return replace(c, invalid=False, reason=why)
        return replace(c, invalid=False, reason="within its noise")

    def line(self) -> str:
        d = self.diff
        rel = f" ({self.relative:+.0%} of {self.level_ms:,.0f} ms)" if self.level_ms else ""
        head = f"A/A control (turn 1, identical work): pull - recompute {d.interval()}{rel}"
        shown = [
            f"{v.interval('{:+.1f}')} at {b.lengths()} tokens"
            for b, v in zip(self.bands, self.band_verdicts(), strict=True)
            if v.status is not Status.UNDETERMINED
        ]
        if not shown:
            return f"{head}: not checked ({self.reason or d.why()})"
        head += (
            f"; pull / recompute by length band {', '.join(shown)} ({self.level:.2%} "
            f"intervals: {len(self.bands)} band(s) x {self.family} control(s) of the run share 5%)"
        )
        if self.invalid:
            return f"{head}: INVALID RUN: {self.reason}"
        return f"{head}: passes ({self.reason})"

    def to_dict(self) -> dict:
        return {
            "pull_minus_recompute": self.diff.to_dict(),
            "level_ms": self.level_ms,
            "relative": self.relative,
            "bands": [
                {"from": b.lo, "to": b.hi, "pull_over_recompute": v.to_dict()}
                for b, v in zip(self.bands, self.band_verdicts(), strict=True)
            ],
            "level": self.level,
            "controls_in_run": self.family,
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

    def disagreements(self) -> list[Cell]:
        """Cells whose own 95% interval puts the faster flow on the other side of the
        decided crossover (recompute faster above it, pull faster below): the curve pools
        every length, a cell speaks for its own."""
        c = self.crossover
        if not c.decided or c.estimate is None or c.shape not in (Shape.CROSSING, Shape.FALLING):
            return []
        rising = c.shape is Shape.CROSSING
        out = []
        for cell in self.cells:
            if not cell.saving.decided:
                continue
            pull_side = (cell.x > c.estimate) == rising
            if (cell.saving.estimate > 0) != pull_side:
                out.append(cell)
        return out

    def disagreement_text(self) -> str:
        """The disagreeing cells in words ('' when none)."""
        cells = self.disagreements()
        if not cells:
            return ""
        c = self.crossover
        inside = [x for x in cells if (c.low or c.lo or 0) <= x.x <= (c.high or c.hi or 0)]
        said = "; ".join(
            f"{x.x:,.0f} tokens: {'pull' if x.saving.estimate > 0 else 'recompute'} faster by "
            f"its own cell, {x.saving.interval('{:+,.1f}')}"
            for x in cells
        )
        where = " (inside the crossover's interval)" if len(inside) == len(cells) else ""
        return (
            f"note: the crossover is fitted over every length at once; at {said}{where}, "
            "which the fitted curve puts on the other side: read those lengths by their cells"
        )


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


def control_bands(lengths: list[int]) -> list[list[int]]:
    """The shorter and the longer half of the swept lengths (one band for one length)."""
    ordered = sorted(set(lengths))
    half = (len(ordered) + 1) // 2
    return [b for b in (ordered[:half], ordered[half:]) if b]


def _band(per: pd.DataFrame, lengths: list[int]) -> ControlBand:
    """``per``: one row per repetition (``CLUSTER`` and ``r``, its log ratio, ``n``)."""
    mine = per[per["h"].isin(lengths)]
    cl, st = cluster_index(mine, CLUSTER, STRATUM)
    sizes = np.bincount(st)
    share = 1.0 / (len(sizes) * sizes[st])  # each length weighs the same, then its repetitions
    spread = linear_interval((mine["r"].to_numpy(float) * share)[:, None], st)
    return ControlBand(
        min(lengths),
        max(lengths),
        float(spread.estimate[0]),
        float(spread.se[0]),
        float(spread.df[0]) if not spread.undetermined[0] else math.nan,
        int(sizes.min()),
        int(mine["n"].sum()),
    )


def control(first: pd.DataFrame, family: int = 1) -> Control | None:
    """Turn-1 pairs (``paired(req, "pull", "recompute")``) -> the A/A control."""
    if not len(first):
        return None
    w = waves(first, CLUSTER)
    _, st = cluster_index(w, CLUSTER, STRATUM)
    n = len(w)
    spread = linear_interval((w["d_ms"].to_numpy(float) / n)[:, None], st)
    (diff,) = verdicts(spread, int(np.bincount(st).min()), len(first))
    level_ms = float(first["level_ms"].mean())
    g = first[(first["a_ms"] > 0) & (first["b_ms"] > 0)].groupby(CLUSTER, as_index=False)
    per = g[["a_ms", "b_ms"]].mean().assign(n=g.size()["size"].to_numpy())
    per["r"] = np.log(per["a_ms"] / per["b_ms"])
    bands = tuple(_band(per, b) for b in control_bands(per["h"].astype(int).tolist()))
    return Control(diff, level_ms, bands).judged(family)


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
    out.control = control(first)
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
    level: float = LEVEL,
) -> Verdict:
    """``left - right`` TTFT (ms) of requests paired on ``key``, or their ratio
    (``relative``: ``exp(mean log(left / right)) - 1`` in %), averaged per repetition
    (``cluster``), each repetition weighing the same, strata: ``stratum``; its ``level``
    interval."""
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
    (v,) = verdicts(spread, int(np.bincount(st).min()), len(m), unit, level)
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
