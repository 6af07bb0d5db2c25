"""P and D on the same node or on different nodes? (the ``placement`` preset)

Deployments that differ only by ``topology.placement`` (and the transport that follows
from it: NVLink on a node, RDMA between nodes) form a family. Per placement
(``questions/across.py``): KV throughput, mean TTFT per flow at the longest common history
and its paired difference with ``same_node``, each with a 95% interval, and the
placement's crossover and threshold with theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from analysis.kit import plotkit
from analysis.kit.fmt import LATER, tokens
from analysis.load.runs import deployment_label
from analysis.method.compare import families, unmatched
from analysis.method.deployment import Context
from analysis.questions.across import Member, member_record, member_rows, members
from analysis.questions.question import Note, PlotSpec, Question

PLACEMENT_ORDER = ("same_node", "cross_node")
PLACEMENT_AXES = ("topology.placement", "transport")


@dataclass
class PlacementAnswer:
    family: str
    members: list[Member]
    history: int | None
    placements: list[str]  # each member's topology.placement (its name may add the transport)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        names = " vs ".join(m.name for m in self.members)
        at = (
            f"at history {tokens(self.history)}" if self.history is not None else "no common length"
        )
        out = [f"{self.family}: {names} ({LATER}, mean TTFT {at}; 95% CI)"]
        for m in self.members:
            parts = [f"KV moved at {m.gb_s.interval('{:,.2f}', signed=False)}"]
            for flow, v in m.ttft.items():
                text = f"{flow} {v.interval('{:,.0f}', signed=False)}"
                vs = m.versus_first.get(flow)
                if vs is not None:
                    tag = "" if vs.decided else f", {vs.status.value}"
                    text += f" ({vs.interval('{:+,.0f}')} vs {self.members[0].name}{tag})"
                parts.append(text)
            a = m.analysis
            parts.append(f"crossover {a.measured.crossover.describe()}")
            parts.append(f"kv_recompute_threshold {a.threshold_advice.text()}")
            out.append(f"  {m.name}: " + "; ".join(parts))
        out += [f"  {n}" for n in self.notes]
        return ["\n".join(out)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        def extra(m: Member) -> dict[str, Any]:
            return {
                "KV GB/s (NIXL totals, 95% CI)": m.gb_s.interval("{:,.3f}", signed=False),
                "crossover": m.analysis.measured.crossover.describe(),
            }

        return {
            "placement": member_rows(self.family, self.history, self.members, "placement", extra)
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployments": self.family,
            "history": self.history,
            "placements": [
                {
                    "placement": raw,
                    "name": m.name,
                    "transfer_gb_s": m.gb_s.to_dict(),
                    **member_record(m),
                }
                for m, raw in zip(self.members, self.placements, strict=True)
            ],
            "text": self.lines()[0],
        }


def _order(placements: list[str]) -> list[str]:
    rank = {p: i for i, p in enumerate(PLACEMENT_ORDER)}
    return sorted(placements, key=lambda p: (rank.get(p, len(rank)), p))


def answer(ctx: Context) -> list[Any]:
    data = ctx.data
    out: list[Any] = []
    for dep_ids in families(data, PLACEMENT_AXES):
        ok = data.ok_points
        by_place = {
            str(ok[ok["deployment_id"] == d]["placement"].iloc[0]): d
            for d in dep_ids
            if (ok["deployment_id"] == d).any()
        }
        if len(by_place) < 2:
            continue  # the same placement twice: something else differs
        transports = {str(ok[ok["deployment_id"] == d]["transport"].iloc[0]) for d in dep_ids}
        names = _order(list(by_place))
        named = [
            (
                p if len(transports) == 1 else f"{p} ({ctx.deployment(by_place[p]).transport})",
                by_place[p],
            )
            for p in names
        ]
        mem, h = members(ctx, named)
        notes = []
        if not any(np.isfinite(m.gb_s.estimate) for m in mem):
            notes.append("no NIXL transfer totals in these Points (transfer.seconds = 0)")
        omit = ("placement",) if len(transports) == 1 else ("placement", "transport")
        family = deployment_label(dep_ids[0], data.points, omit=omit)
        out.append(PlacementAnswer(family, mem, h, names, notes))
    note = unmatched(data, "placement", PLACEMENT_AXES, bool(out))
    return out + ([Note(note)] if note else [])


def placement(plt, answers: list[Any], ctx: Context):
    answers = [a for a in answers if isinstance(a, PlacementAnswer)]
    if not answers:
        return None
    fig, axes = plt.subplots(
        len(answers),
        2,
        figsize=(11.0, 4.0 * len(answers)),
        squeeze=False,
        gridspec_kw={"width_ratios": [2, 1]},
    )
    for (ax, ax_bw), a in zip(axes, answers, strict=True):
        flows = plotkit.ordered(f for m in a.members for f in m.ttft)
        width = 0.8 / max(len(a.members), 1)
        for i, m in enumerate(a.members):
            xs = [j + (i - (len(a.members) - 1) / 2) * width for j in range(len(flows))]
            vs = [m.ttft.get(f) for f in flows]
            est = [v.estimate if v else np.nan for v in vs]
            bars = ax.bar(xs, est, width=width, label=m.name)
            plotkit.errorbars(
                ax,
                xs,
                est,
                [v.low if v else np.nan for v in vs],
                [v.high if v else np.nan for v in vs],
                fmt="none",
                ecolor="k",
                elinewidth=0.8,
                capsize=2,
            )
            ax_bw.bar([i], [m.gb_s.estimate], color=bars.patches[0].get_facecolor())
            plotkit.errorbars(
                ax_bw,
                [i],
                [m.gb_s.estimate],
                [m.gb_s.low],
                [m.gb_s.high],
                fmt="none",
                ecolor="k",
                capsize=3,
            )
        ax.set_xticks(range(len(flows)))
        ax.set_xticklabels(flows)
        ax.set_ylabel(f"mean TTFT, {LATER} (ms) at history {tokens(a.history)}")
        ax.set_title(a.family, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        ax_bw.set_xticks(range(len(a.members)))
        ax_bw.set_xticklabels([m.name for m in a.members], fontsize=8)
        ax_bw.set_ylabel("KV moved (GB/s, NIXL totals)")
        ax_bw.set_title("transfer.bytes / transfer.seconds per Point", fontsize=9)
        ax_bw.grid(axis="y", alpha=0.3)
    fig.suptitle("Same node vs cross node (95% CIs over the repetitions)")
    return fig


QUESTION = Question(
    name="placement",
    title="Same node or cross node?",
    answer=answer,
    plots=(
        PlotSpec(
            "placement",
            "Same node vs cross node",
            placement,
            "mean TTFT per flow at the longest common history, and KV throughput",
        ),
    ),
    method=(
        "<b>Placement</b>: per placement, its crossover and threshold (95% CI), its mean TTFT "
        "per flow at the longest history every placement measured and the paired "
        "difference with <code>same_node</code> (95% CI), and its NIXL throughput per Point."
    ),
)
