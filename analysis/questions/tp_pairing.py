"""Which TP pairing (prefill TP -> decode TP)?

Deployments that differ only by their topology's TP sizes form a family. Per pairing
(``questions/across.py``): its crossover and threshold with their 95% intervals, its mean
TTFT per flow at the longest common history, and the paired difference with the first
pairing. The faster pairing is named from the pull flow's TTFT (recompute when no pull),
decided only when its difference's interval excludes 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.kit import plotkit
from analysis.kit.fmt import LATER, tokens
from analysis.load.runs import deployment_label
from analysis.method.compare import families
from analysis.method.deployment import Context
from analysis.method.pull_recompute import flow_levels
from analysis.method.saving_curve import Shape
from analysis.questions.across import Member, member_record, member_rows, members
from analysis.questions.question import PlotSpec, Question

TP_AXES = ("topology.name", "topology.prefill.tp", "topology.decode.tp")


@dataclass
class TPAnswer:
    family: str
    members: list[Member]
    history: int | None
    flow: str  # the flow the pairings are ranked by

    def verdict(self) -> str:
        first = self.members[0]
        others = [(m, m.versus_first.get(self.flow)) for m in self.members[1:]]
        faster = [m.name for m, v in others if v is not None and v.decided and v.estimate < 0]
        slower = [m.name for m, v in others if v is not None and v.decided and v.estimate > 0]
        open_ = [m.name for m, v in others if v is None or not v.decided]
        if open_:
            return f"not determined between TP {first.name} and {', '.join(open_)} ({self.flow})"
        if faster:
            return f"TP {', '.join(faster)} faster than {first.name} ({self.flow})"
        return f"TP {first.name} fastest ({self.flow}; {', '.join(slower)} slower)"

    def lines(self) -> list[str]:
        at = f"history {tokens(self.history)}" if self.history is not None else "no common length"
        out = [f"{self.family}: TP pairing: {self.verdict()}; mean TTFT at {at} ({LATER}, 95% CI)"]
        for m in self.members:
            v = m.ttft.get(self.flow)
            level = v.interval("{:,.0f}", signed=False) if v else "n/a"
            parts = [f"{self.flow} {level}"]
            vs = m.versus_first.get(self.flow)
            if vs is not None:
                parts[0] += f" ({vs.interval('{:+,.0f}')} vs {self.members[0].name})"
            parts.append(f"crossover {m.analysis.measured.crossover.describe()}")
            parts.append(f"kv_recompute_threshold {m.analysis.threshold_advice.text()}")
            out.append(f"  TP {m.name}: " + "; ".join(parts))
        return ["\n".join(out)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        def extra(m: Member) -> dict[str, Any]:
            return {
                "crossover": m.analysis.measured.crossover.describe(),
                "threshold": m.analysis.threshold_advice.text(),
            }

        return {
            "tp_pairing": member_rows(self.family, self.history, self.members, "TP P->D", extra)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployments": self.family,
            "history": self.history,
            "ranked_by": self.flow,
            "verdict": self.verdict(),
            "pairings": [{"tp_pair": m.name, **member_record(m)} for m in self.members],
            "text": self.lines()[0],
        }


def answer(ctx: Context) -> list[TPAnswer]:
    data = ctx.data
    out = []
    ok = data.ok_points
    for dep_ids in families(data, TP_AXES):
        pairs = {str(ok[ok["deployment_id"] == d]["tp_pair"].iloc[0]): d for d in dep_ids}
        if len(pairs) < 2:
            continue
        named = sorted(
            pairs.items(),
            key=lambda kv: [int(x) for x in kv[0].split("->")] if "->" in kv[0] else [0],
        )
        mem, h = members(ctx, named)
        flows = {f for m in mem for f in m.ttft}
        flow = "pull" if "pull" in flows else "recompute" if "recompute" in flows else None
        if flow is None:
            continue
        family = deployment_label(dep_ids[0], data.points, omit=("tp",))
        out.append(TPAnswer(family, mem, h, flow))
    return out


def tp_pairing(plt, answers: list[TPAnswer], ctx: Context):
    """Pull and recompute mean TTFT vs history per pairing (95% CI), crossovers dotted."""
    if not answers:
        return None
    fig, axes = plotkit.grid(plt, len(answers), width=6.0, height=4.0)
    for ax, a in zip(axes, answers, strict=True):
        for m in a.members:
            levels = flow_levels(ctx.requests, m.analysis.deployment_id)
            levels = levels[levels["turn"] >= 2].sort_values("x")
            if not len(levels):
                continue
            (line,) = ax.plot([], [])
            color = line.get_color()
            for flow, style in (("pull", "o-"), ("recompute", "s--")):
                f = levels[levels["flow"] == flow]
                plotkit.errorbars(
                    ax,
                    f["x"],
                    f["ttft_ms"],
                    f["low"],
                    f["high"],
                    fmt=style,
                    ms=3.5,
                    color=color,
                    label=f"{flow}, TP {m.name}",
                )
            c = m.analysis.measured.crossover
            if c.shape is Shape.CROSSING and c.estimate is not None:
                ax.axvline(c.estimate, ls=":", color=color, lw=1)
                plotkit.crossover_span(ax, c, color, label=None)
        ax.set_title(a.family, fontsize=9)
        ax.set_xlabel("history length at the turn (tokens)")
        ax.set_ylabel("mean TTFT (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("TP pairings (prefill TP -> decode TP), turns >= 2; shaded: crossover 95% CI")
    return fig


QUESTION = Question(
    name="tp_pairing",
    title="Which TP pairing?",
    answer=answer,
    plots=(
        PlotSpec(
            "tp_pairing",
            "TP pairings",
            tp_pairing,
            "pull (solid) and recompute (dashed) per pairing",
        ),
    ),
    method=(
        "<b>TP pairing</b>: per pairing its crossover and threshold (95% CI) and its mean "
        "TTFT per flow at the longest common history, with the paired difference to the "
        "first pairing (95% CI)."
    ),
)
