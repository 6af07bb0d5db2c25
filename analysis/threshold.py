"""Which ``kv_recompute_threshold``? (the ``threshold_sweep`` preset), pure.

Deployments that differ only by ``kv_recompute_threshold`` form a family. Per family and
per flow the threshold matters to (``pull``, ``decode_first``): the TTFT p50 of turns >= 2
at each (threshold, swept history length). Each history length is scored against its
fastest threshold (TTFT / fastest TTFT), and the best threshold is the one with the lowest
geometric mean of those ratios over the history lengths every threshold was measured at:
no single length dominates the way a sum of milliseconds would let the longest one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.compare import FEW_REQUESTS, LATER, families, ms, point_ttft, rel, span, tokens
from analysis.load import RunData, deployment_label

THRESHOLD_FLOWS = ("pull", "decode_first")
THRESHOLD_AXES = ("kv_recompute_threshold",)
TIE = 1e-6  # relative score difference below which two thresholds tie


@dataclass
class ThresholdAnswer:
    family: str  # the deployments' label without the threshold
    flow: str
    deployment_ids: list[str]
    # threshold history_tokens ttft_ms n flagged deployment_id point_id
    table: pd.DataFrame
    histories: list[int]  # the lengths every threshold was measured at (scored)
    scores: dict[Any, float]  # threshold -> geometric mean of TTFT / fastest TTFT
    best: Any
    tied: list[Any] = field(default_factory=list)
    best_per_history: dict[int, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def cell(self, threshold: Any, history: int) -> pd.Series | None:
        rows = self.table[
            (self.table["threshold"] == threshold) & (self.table["history_tokens"] == history)
        ]
        return rows.iloc[0] if len(rows) else None

    def line(self) -> str:
        """Two lines: the best threshold with its TTFTs, then the others and per length."""
        at = []
        for h in self.histories:
            c = self.cell(self.best, h)
            if c is not None:
                how = route(c["pulled_share"])
                at.append(
                    f"{ms(c['ttft_ms'], c['flagged'])} at history {tokens(h)}"
                    + (f", {how}" if how else "")
                )
        tie = f", tied with {', '.join(map(str, self.tied))}" if self.tied else ""
        head = (
            f"{self.family}, flow {self.flow}: best kv_recompute_threshold: {self.best}{tie} "
            f"(TTFT p50, {LATER}: {'; '.join(at)})"
        )
        others = [
            f"{thr} {rel(score, self.scores[self.best])}"
            for thr, score in sorted(self.scores.items(), key=lambda kv: kv[1])
            if thr != self.best
        ]
        per_h = ", ".join(f"{tokens(h)} -> {t}" for h, t in self.best_per_history.items())
        tail = []
        if others:
            tail.append(
                f"others (TTFT vs the best, geometric mean over lengths): {', '.join(others)}"
            )
        if per_h:
            tail.append(f"fastest per history length: {per_h}")
        tail += self.notes
        return head + ("\n  " + "; ".join(tail) if tail else "")


def _number(value: Any) -> Any:
    """1024.0 -> 1024 (a column with a missing threshold turns to floats)."""
    try:
        return int(value) if float(value).is_integer() else float(value)
    except (TypeError, ValueError):
        return value


def _answer(per: pd.DataFrame, family: str, flow: str, dep_ids: list[str]) -> ThresholdAnswer:
    table = (
        per[
            [
                "threshold",
                "history_tokens",
                "ttft_ms",
                "n",
                "flagged",
                "pulled_share",
                "deployment_id",
                "point_id",
            ]
        ]
        .sort_values(["history_tokens", "threshold"])
        .reset_index(drop=True)
    )
    grid = table.pivot_table(index="threshold", columns="history_tokens", values="ttft_ms")
    common = [h for h in grid.columns if grid[h].notna().all()]
    scored = grid[common] if common else grid
    ratios = scored / scored.min(axis=0)
    scores = {thr: float(np.exp(np.log(r.dropna()).mean())) for thr, r in ratios.iterrows()}
    best = min(scores, key=lambda t: (scores[t], t))
    tied = [t for t, s in scores.items() if t != best and s <= scores[best] * (1 + TIE)]
    notes = []
    if not common:
        notes.append("no history length was measured at every threshold: scores are partial")
    few = table[table["n"] < FEW_REQUESTS]
    if len(few):
        notes.append(f"{span(table['n'])} requests per cell: noisy")
    per_h = {int(h): grid[h].idxmin() for h in grid.columns if grid[h].notna().any()}
    return ThresholdAnswer(
        family=family,
        flow=flow,
        deployment_ids=dep_ids,
        table=table,
        histories=[int(h) for h in (common or list(grid.columns))],
        scores=scores,
        best=best,
        tied=sorted(tied),
        best_per_history=per_h,
        notes=notes,
    )


def threshold_answers(
    data: RunData, per_point: pd.DataFrame | None = None
) -> list[ThresholdAnswer]:
    """One answer per (family of two or more thresholds, flow the threshold matters to)."""
    per_point = point_ttft(data) if per_point is None else per_point
    out = []
    for dep_ids in families(data, THRESHOLD_AXES):
        rows = per_point[per_point["deployment_id"].isin(dep_ids)]
        rows = rows[rows["threshold"].notna() & rows["ttft_ms"].notna()]
        rows = rows.assign(threshold=rows["threshold"].map(_number))
        family = deployment_label(dep_ids[0], data.points, omit=("threshold",))
        for flow in [f for f in THRESHOLD_FLOWS if f in set(rows["flow"])]:
            per = rows[rows["flow"] == flow]
            if per["threshold"].nunique() < 2:
                continue
            # several Points at one (threshold, history), e.g. two workload kinds: the median
            per = per.groupby(["threshold", "history_tokens"], as_index=False).agg(
                ttft_ms=("ttft_ms", "median"),
                n=("n", "sum"),
                flagged=("flagged", "any"),
                pulled_share=("pulled_share", "mean"),
                deployment_id=("deployment_id", "first"),
                point_id=("point_id", "first"),
            )
            mine = sorted(per["deployment_id"].unique())
            out.append(_answer(per, family, flow, mine))
    return out


def route(share: float) -> str:
    """What the turns >= 2 did: ``pulled``, ``recomputed`` or ``pulled 40%``."""
    if share != share:
        return ""
    return "pulled" if share >= 1 else "recomputed" if share <= 0 else f"pulled {share:.0%}"


def _cell(c: pd.Series) -> str:
    how = route(c["pulled_share"])
    return ms(c["ttft_ms"], c["flagged"]) + (f" ({how})" if how else "")


def threshold_rows(answers: list[ThresholdAnswer]) -> list[dict[str, Any]]:
    """For the report: one row per (family, flow, threshold), a column per history."""
    rows = []
    for a in answers:
        for thr in sorted(a.scores, key=lambda t: (a.scores[t], t)):
            row: dict[str, Any] = {"deployments": a.family, "flow": a.flow, "threshold": thr}
            for h in sorted(a.table["history_tokens"].unique()):
                c = a.cell(thr, h)
                row[f"h {tokens(h)}"] = "–" if c is None else _cell(c)
            row["vs best"] = "best" if thr == a.best else rel(a.scores[thr], a.scores[a.best])
            rows.append(row)
    return rows
