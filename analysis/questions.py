"""The presets' questions besides the crossover, and the flagged Points, in one place (pure).

``answer_questions`` looks at what the run holds, not at the preset's name (several run
dirs can be analysed together): a family of deployments that differ only by
``kv_recompute_threshold`` asks ``threshold.py``'s question, one that differs only by
``topology.placement`` asks ``placement.py``'s, a deployment with three or more flows (or
two on two workload kinds) asks ``flows.py``'s. A Point's ``flags`` can mean its TTFT
measured a stall, not the work: every flagged Point gets a line of the answer, and values
that come from one carry a ``*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.compare import later_requests, point_ttft, tokens, unmatched
from analysis.crossover import DeploymentAnalysis
from analysis.flows import FlowsAnswer, flows_answers
from analysis.load import RunData, deployment_label
from analysis.placement import PLACEMENT_AXES, PlacementAnswer, placement_answers
from analysis.threshold import THRESHOLD_AXES, ThresholdAnswer, threshold_answers

FLAG_LINES = 10  # flagged Points listed in the answer; the rest are counted
FLAG_CHARS = 150  # each flag shortened to this many characters (parentheses dropped first)


@dataclass
class FlaggedPoint:
    point_id: str
    label: str  # deployment
    flow: str
    kind: str
    history_tokens: int
    status: str
    flags: list[str]

    def line(self) -> str:
        what = f"{self.label} · {self.flow} · {self.kind or '?'} h{tokens(self.history_tokens)}"
        status = "" if self.status == "ok" else f" [{self.status}]"
        return f"  * {what}{status}: {' | '.join(shorten(f) for f in self.flags)}"


def shorten(text: str, limit: int = FLAG_CHARS) -> str:
    """One line of at most ``limit`` characters; a long one loses its parentheses first."""
    text = " ".join(str(text).split())
    if len(text) > limit:
        text = " ".join(re.sub(r"\s*\([^()]{6,}\)", "", text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def flagged_points(data: RunData) -> list[FlaggedPoint]:
    pts = data.points
    if not len(pts) or "flags" not in pts:
        return []
    rows = pts[pts["flags"].fillna("").astype(str) != ""]
    return [
        FlaggedPoint(
            point_id=str(p["point_id"]),
            label=deployment_label(p["deployment_id"], pts),
            flow=str(p["flow"]),
            kind=str(p.get("kind", "") or ""),
            history_tokens=int(p["history_tokens"]),
            status=str(p["status"]),
            flags=str(p["flags"]).split("; "),
        )
        for _, p in rows.sort_values(["deployment_id", "kind", "history_tokens", "flow"]).iterrows()
    ]


def flag_lines(flagged: list[FlaggedPoint], limit: int = FLAG_LINES) -> list[str]:
    if not flagged:
        return []
    head = (
        f"{len(flagged)} Point(s) flagged: their TTFT may measure a stall, not the work "
        "(* marks their values below):"
    )
    lines = [f.line() for f in flagged[:limit]]
    if len(flagged) > limit:
        lines.append(f"  ... and {len(flagged) - limit} more (the report's Points tables)")
    return [head + "\n" + "\n".join(lines)]


@dataclass
class Questions:
    threshold: list[ThresholdAnswer] = field(default_factory=list)
    flows: list[FlowsAnswer] = field(default_factory=list)
    placement: list[PlacementAnswer] = field(default_factory=list)
    flagged: list[FlaggedPoint] = field(default_factory=list)
    per_point: pd.DataFrame = field(default_factory=pd.DataFrame)
    notes: list[str] = field(default_factory=list)  # questions swept but not comparable

    @property
    def answered(self) -> bool:
        return bool(self.threshold or self.flows or self.placement)

    def titles(self) -> list[str]:
        out = []
        if self.threshold:
            out.append("Which kv_recompute_threshold?")
        if self.flows:
            out.append("Which flow?")
        if self.placement:
            out.append("Same node or cross node?")
        return out

    def lines(self) -> list[str]:
        return (
            [a.line() for a in self.threshold]
            + [a.line() for a in self.flows]
            + [a.line() for a in self.placement]
            + self.notes
        )


def answer_questions(data: RunData, analyses: list[DeploymentAnalysis]) -> Questions:
    if not len(data.points):
        return Questions()
    per_point = point_ttft(data)
    later = later_requests(data)
    threshold = threshold_answers(data, per_point)
    placement = placement_answers(data, analyses, per_point)
    notes = [
        unmatched(data, "threshold", THRESHOLD_AXES, bool(threshold)),
        unmatched(data, "placement", PLACEMENT_AXES, bool(placement)),
    ]
    return Questions(
        threshold=threshold,
        flows=flows_answers(data, later),
        placement=placement,
        flagged=flagged_points(data),
        per_point=per_point,
        notes=[n for n in notes if n],
    )


def questions_summary(q: Questions) -> dict[str, Any]:
    """For summary.json."""
    return {
        "threshold": [
            {
                "deployments": a.family,
                "flow": a.flow,
                "best_kv_recompute_threshold": a.best,
                "tied": a.tied,
                "scores": {str(k): v for k, v in a.scores.items()},
                "best_per_history": {str(k): v for k, v in a.best_per_history.items()},
                "table": a.table.to_dict(orient="records"),
                "text": a.line(),
            }
            for a in q.threshold
        ],
        "flows": [
            {
                "deployment": a.label,
                "kind": a.kind,
                "histories": a.histories,
                "fastest_flow": a.best,
                "table": a.table.to_dict(orient="records"),
                "decode_first_routes": a.routes,
                "best_per_history": {str(k): v for k, v in a.best_per_history.items()},
                "text": a.line(),
            }
            for a in q.flows
        ],
        "placement": [
            {
                "deployments": a.family,
                "history": a.history,
                "placements": [
                    {
                        "placement": r.placement,
                        "transport": r.transport,
                        "deployment_id": r.deployment_id,
                        "transfer_gb_s": r.gb_s,
                        "largest_transfers_gb_s": r.plateau_gb_s,
                        "crossover": r.crossover,
                        "recommended_kv_recompute_threshold": r.recommended_threshold,
                        "ttft_ms": {f"{f}@{h}": v for (f, h), (v, _) in r.ttft.items()},
                    }
                    for r in a.rows
                ],
                "text": a.line(),
            }
            for a in q.placement
        ],
        "notes": q.notes,
        "flagged_points": [
            {"point_id": f.point_id, "deployment": f.label, "flow": f.flow, "flags": f.flags}
            for f in q.flagged
        ],
    }
