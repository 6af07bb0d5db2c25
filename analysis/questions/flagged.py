"""Which Points' numbers are suspect? A Point's ``flags`` can mean its TTFT measured a stall,
not the work: every flagged Point gets a line of the answer (the first ``FLAG_LINES``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.kit.fmt import shorten, tokens
from analysis.load.runs import RunData, deployment_label
from analysis.method.deployment import Context
from analysis.questions.question import Question

FLAG_LINES = 10  # flagged Points listed in the answer; the rest are counted


@dataclass
class FlaggedPoint:
    point_id: str
    label: str  # deployment
    flow: str
    kind: str
    history_tokens: int
    repetition: int
    status: str
    flags: list[str]

    def line(self) -> str:
        what = f"{self.label} · {self.flow} · {self.kind or '?'} h{tokens(self.history_tokens)}"
        what += f" r{self.repetition}"
        status = "" if self.status == "ok" else f" [{self.status}]"
        return f"  * {what}{status}: {' | '.join(shorten(f) for f in self.flags)}"


@dataclass
class Flagged:
    points: list[FlaggedPoint]
    headline = False  # a warning, not an answer

    def lines(self) -> list[str]:
        head = (
            f"{len(self.points)} Point(s) flagged: their TTFT may measure a stall, not the work "
            "(* marks their values below):"
        )
        shown = [f.line() for f in self.points[:FLAG_LINES]]
        if len(self.points) > FLAG_LINES:
            rest = len(self.points) - FLAG_LINES
            shown.append(f"  ... and {rest} more (the report's Points tables)")
        return [head + "\n" + "\n".join(shown)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": [
                {"point_id": f.point_id, "deployment": f.label, "flow": f.flow, "flags": f.flags}
                for f in self.points
            ]
        }


def flagged_points(data: RunData) -> list[FlaggedPoint]:
    pts = data.points
    if not len(pts) or "flags" not in pts:
        return []
    rows = pts[pts["flags"].fillna("").astype(str) != ""]
    rows = rows.sort_values(["deployment_id", "kind", "history_tokens", "flow", "repetition"])
    return [
        FlaggedPoint(
            point_id=str(p["point_id"]),
            label=deployment_label(p["deployment_id"], pts),
            flow=str(p["flow"]),
            kind=str(p["kind"] or ""),
            history_tokens=int(p["history_tokens"]),
            repetition=int(p["repetition"]),
            status=str(p["status"]),
            flags=str(p["flags"]).split("; "),
        )
        for _, p in rows.iterrows()
    ]


def answer(ctx: Context) -> list[Flagged]:
    points = flagged_points(ctx.data)
    return [Flagged(points)] if points else []


QUESTION = Question(name="flagged", title="Flagged Points", answer=answer)
