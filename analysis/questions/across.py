"""Deployments of one family compared with each other (placement, TP pairing), pure.

Per deployment: its crossover and threshold (``deployment``), its mean TTFT per flow at the
longest history length every member measured, and the paired difference of that TTFT with
the family's first member (same repetition, conversation and turn: the workload is the
same, the servers are not) with its 95% interval; the NIXL throughput of its Points
(``transfer.bytes / transfer.seconds`` per Point, mean over Points with its interval).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.kit.fmt import LATER, tokens
from analysis.method.deployment import Context, DeploymentAnalysis
from analysis.method.pairs import PAIR_KEY
from analysis.method.pull_recompute import level, paired_difference
from analysis.method.stats import Verdict, mean_verdict


@dataclass
class Member:
    name: str  # what tells it apart (placement, TP pairing)
    analysis: DeploymentAnalysis
    ttft: dict[str, Verdict]  # flow -> mean TTFT at the common history, turns >= 2
    versus_first: dict[str, Verdict]  # flow -> TTFT - the first member's, ms
    gb_s: Verdict  # NIXL throughput per Point

    @property
    def label(self) -> str:
        return self.analysis.label


def kv_rate(points: pd.DataFrame, dep_id: str) -> Verdict:
    """GB/s of the deployment's ok Points that moved KV (one value per Point)."""
    p = points[
        (points["deployment_id"] == dep_id)
        & (points["status"] == "ok")
        & (points["transfer_seconds"].fillna(0) > 0)
    ]
    rate = (p["transfer_bytes"] / p["transfer_seconds"] / 1e9).to_numpy(float)
    return mean_verdict(rate, unit="GB/s", requests=len(rate))


def members(ctx: Context, named: list[tuple[str, str]]) -> tuple[list[Member], int | None]:
    """``named``: (name, deployment id) in the order to show; the first is the baseline.
    Returns the members and the common history length compared (None: none in common)."""
    req = ctx.requests
    later = req[req["turn"] >= 2] if len(req) else req
    mine = {dep: later[later["deployment_id"] == dep] for _, dep in named}
    common = set.intersection(*(set(m["h"]) for m in mine.values())) if mine else set()
    h = max(common) if common else None
    base_dep = named[0][1]
    out = []
    for name, dep in named:
        rows = mine[dep][mine[dep]["h"] == h] if h is not None else mine[dep].iloc[0:0]
        base = mine[base_dep][mine[base_dep]["h"] == h] if h is not None else rows
        flows = sorted(set(rows["flow"]))
        ttft = {f: level(rows[rows["flow"] == f]) for f in flows}
        versus = {
            f: paired_difference(rows[rows["flow"] == f], base[base["flow"] == f], PAIR_KEY)
            for f in flows
            if dep != base_dep and (base["flow"] == f).any()
        }
        out.append(Member(name, ctx.deployment(dep), ttft, versus, kv_rate(ctx.data.points, dep)))
    return out, h


def member_rows(
    family: str,
    history: int,
    members: list[Member],
    name_column: str,
    extra: Callable[[Member], dict[str, Any]],
) -> list[dict[str, Any]]:
    """One row per (member, flow) of a family's table: the member by ``name_column``, its
    mean TTFT and its difference with the first member, then ``extra(member)``'s columns."""
    rows = []
    for m in members:
        for flow, v in m.ttft.items():
            vs = m.versus_first.get(flow)
            rows.append(
                {
                    "deployments": family,
                    name_column: m.name,
                    "flow": flow,
                    "history": tokens(history),
                    f"mean TTFT, {LATER} (95% CI)": v.interval(signed=False),
                    f"vs {members[0].name} (95% CI)": vs.interval() if vs else "–",
                    **extra(m),
                }
            )
    return rows


def member_record(m: Member) -> dict[str, Any]:
    """A member's figures in a summary: its TTFT, its difference with the first member, its
    crossover and threshold."""
    return {
        "deployment_id": m.analysis.deployment_id,
        "ttft_ms": {f: v.to_dict() for f, v in m.ttft.items()},
        "versus_first_ms": {f: v.to_dict() for f, v in m.versus_first.items()},
        "crossover": m.analysis.measured.crossover.to_dict(),
        "recommended_kv_recompute_threshold": m.analysis.threshold_advice.to_dict(),
    }
