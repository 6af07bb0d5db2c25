"""P and D on the same node or on different nodes? (the ``placement`` preset), pure.

Deployments that differ only by ``topology.placement`` form a family. Per placement: the
KV throughput of its Points (``transfer.bytes / transfer.seconds`` summed over the ok
Points: NIXL's own totals, every flow), the TTFT p50 of turns >= 2 per flow at the longest
history length every placement measured, and the pull-vs-recompute crossover of that
deployment (``crossover.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.compare import LATER, families, ms, point_ttft, rel, tokens
from analysis.crossover import DeploymentAnalysis
from analysis.flows import ordered
from analysis.load import RunData, deployment_label

PLACEMENT_ORDER = ("same_node", "cross_node")
# the placement decides the fabric (NVLink on a node, RDMA between nodes): a transport that
# changes with it is part of the comparison, not a different deployment family
PLACEMENT_AXES = ("topology.placement", "transport")


@dataclass
class PlacementRow:
    placement: str
    transport: str
    deployment_id: str
    label: str
    transfer_bytes: float
    transfer_seconds: float
    ttft: dict[tuple[str, int], tuple[float, bool]]  # (flow, history) -> (ms, flagged)
    crossover: str
    recommended_threshold: int | None
    plateau_gb_s: float | None = None  # the largest transfers' rate (``crossover.py``)

    @property
    def gb_s(self) -> float:
        if self.transfer_seconds <= 0:
            return float("nan")
        return self.transfer_bytes / self.transfer_seconds / 1e9


@dataclass
class PlacementAnswer:
    family: str
    rows: list[PlacementRow]
    history: int | None  # the longest length every placement measured
    flows: list[str]
    notes: list[str] = field(default_factory=list)

    def names(self) -> list[str]:
        """``same_node``, or ``same_node (nvlink)`` when the transports differ too."""
        if len({r.transport for r in self.rows}) == 1:
            return [r.placement for r in self.rows]
        return [f"{r.placement} ({r.transport})" for r in self.rows]

    def line(self) -> str:
        names = " vs ".join(self.names())
        head = f"{self.family}: {names} ({LATER})"
        base = self.rows[0]
        out = [head]
        for r, name in zip(self.rows, self.names(), strict=True):
            gb = "n/a" if not np.isfinite(r.gb_s) else f"{r.gb_s:,.2f} GB/s"
            if r is not base and np.isfinite(r.gb_s) and np.isfinite(base.gb_s):
                gb += f" ({rel(r.gb_s, base.gb_s)} vs {base.placement})"
            if r.plateau_gb_s:
                gb += f", {r.plateau_gb_s:,.2f} GB/s on the largest transfers"
            ttft = []
            for flow in self.flows:
                v, flag = r.ttft.get((flow, self.history), (float("nan"), False))
                text = f"{flow} {ms(v, flag)}"
                b = base.ttft.get((flow, self.history), (float("nan"), False))[0]
                if r is not base and np.isfinite(v) and np.isfinite(b):
                    text += f" ({rel(v, b)})"
                ttft.append(text)
            at = f"TTFT p50 at history {tokens(self.history)}: {', '.join(ttft)}; " if ttft else ""
            thr = r.recommended_threshold
            thr_text = f" -> kv_recompute_threshold {thr:,}" if thr is not None else ""
            out.append(f"  {name}: KV moved at {gb}; {at}crossover {r.crossover}{thr_text}")
        out += [f"  {n}" for n in self.notes]
        return "\n".join(out)


def _order(placements: list[str]) -> list[str]:
    """same_node first, then cross_node, then any other name."""
    rank = {p: i for i, p in enumerate(PLACEMENT_ORDER)}
    return sorted(placements, key=lambda p: (rank.get(p, len(rank)), p))


def placement_answers(
    data: RunData,
    analyses: list[DeploymentAnalysis],
    per_point: pd.DataFrame | None = None,
) -> list[PlacementAnswer]:
    per_point = point_ttft(data) if per_point is None else per_point
    by_dep = {a.deployment_id: a for a in analyses}
    out = []
    for dep_ids in families(data, PLACEMENT_AXES):
        rows_by_place: dict[str, PlacementRow] = {}
        for dep_id in dep_ids:
            pts = per_point[per_point["deployment_id"] == dep_id]
            place = str(pts["placement"].iloc[0]) if len(pts) else "?"
            ttft = {
                (str(p["flow"]), int(p["history_tokens"])): (
                    float(p["ttft_ms"]),
                    bool(p["flagged"]),
                )
                for _, p in pts.iterrows()
                if p["ttft_ms"] == p["ttft_ms"]
            }
            moved = pts[pts["transfer_seconds"].fillna(0) > 0]
            a = by_dep.get(dep_id)
            rows_by_place[place] = PlacementRow(
                placement=place,
                transport=str(pts["transport"].iloc[0]) if len(pts) else "?",
                deployment_id=dep_id,
                label=deployment_label(dep_id, data.points),
                transfer_bytes=float(moved["transfer_bytes"].sum()),
                transfer_seconds=float(moved["transfer_seconds"].sum()),
                ttft=ttft,
                crossover=a.measured.describe() if a else "n/a",
                recommended_threshold=a.recommended_threshold if a else None,
                plateau_gb_s=a.bandwidth_bytes_per_s / 1e9
                if a and a.bandwidth_bytes_per_s
                else None,
            )
        if len(rows_by_place) < 2:
            continue  # the same placement twice: something else differs (not this question)
        rows = [rows_by_place[p] for p in _order(list(rows_by_place))]
        common = set.intersection(*({h for _, h in r.ttft} for r in rows))
        flows = ordered(f for r in rows for f, _ in r.ttft)
        notes = []
        if not any(np.isfinite(r.gb_s) for r in rows):
            notes.append("no NIXL transfer totals in these Points (transfer.seconds = 0)")
        omit = (
            ("placement",) if len({r.transport for r in rows}) == 1 else ("placement", "transport")
        )
        out.append(
            PlacementAnswer(
                family=deployment_label(dep_ids[0], data.points, omit=omit),
                rows=rows,
                history=max(common) if common else None,
                flows=flows if common else [],
                notes=notes,
            )
        )
    return out


def placement_rows(answers: list[PlacementAnswer]) -> list[dict[str, Any]]:
    """For the report: one row per (family, placement, flow, history)."""
    out = []
    for a in answers:
        for r in a.rows:
            for (flow, h), (v, flag) in sorted(r.ttft.items(), key=lambda kv: (kv[0][1], kv[0][0])):
                out.append(
                    {
                        "deployments": a.family,
                        "placement": r.placement,
                        "flow": flow,
                        "history": tokens(h),
                        f"TTFT p50, {LATER}": ms(v, flag),
                        "KV GB/s (NIXL totals)": "–"
                        if not np.isfinite(r.gb_s)
                        else f"{r.gb_s:.3f}",
                        "GB/s, largest transfers": "–"
                        if not r.plateau_gb_s
                        else f"{r.plateau_gb_s:.3f}",
                        "crossover": r.crossover,
                    }
                )
    return out
