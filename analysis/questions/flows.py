"""Which flow serves each workload best? (the ``flows`` preset)

Per deployment and workload kind: each flow's mean TTFT over turns >= 2 (pooled over the
swept lengths, each repetition weighing the same) with its 95% interval, and the fastest
flow's paired difference with every other flow (same conversations, same turns) with its
interval. The fastest flow is *decided* only when every one of those intervals excludes
0; otherwise the answer names the flows it cannot tell apart. For ``decode_first`` the
routes its turns >= 2 took are counted (``by_turn[].paths``), and for ``pull`` and
``decode_first`` the turns the router recomputed because the prompt no longer began with
D's tokens (``recompute_diverged``: the client edited the history) or because D's lease on
the history had run out (``recompute_expired``: the TTL too short for the load's waves).

Asked where a deployment ran three or more flows, or two or more flows on two or more
kinds: a two-flow pull-vs-recompute sweep is the crossover's question.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit import plotkit
from analysis.kit.fmt import LATER, tokens
from analysis.load.runs import RunData, deployment_label
from analysis.method.deployment import Context
from analysis.method.pairs import PAIR_KEY
from analysis.method.pull_recompute import level, paired_difference
from analysis.method.stats import Verdict
from analysis.questions.question import PlotSpec, Question

BASELINES = ("agg", "recompute")
DIVERGED = "recompute_diverged"  # the router's route when the prompt left D's tokens
EXPIRED = "recompute_expired"  # the router's route when D's lease had run out


@dataclass
class FlowsAnswer:
    deployment_id: str
    label: str
    kind: str
    histories: list[int]
    levels: dict[str, Verdict]  # flow -> mean TTFT
    best: str
    versus: dict[str, Verdict]  # other flow -> other - best (ms)
    flagged: dict[str, bool] = field(default_factory=dict)
    routes: dict[str, int] = field(default_factory=dict)  # decode_first, turns >= 2
    # flow -> (turns >= 2 recomputed because the history was edited, turns >= 2)
    diverged: dict[str, tuple[int, int]] = field(default_factory=dict)
    # flow -> (turns >= 2 recomputed because D's lease on the history had run out, turns >= 2)
    expired: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def decided(self) -> bool:
        return bool(self.versus) and all(v.decided for v in self.versus.values())

    @property
    def tied(self) -> list[str]:
        return [f for f, v in self.versus.items() if not v.decided]

    def route_shares(self) -> str:
        total = sum(self.routes.values())
        if not total:
            return ""
        parts = sorted(self.routes.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k} {v}/{total} ({v / total:.0%})" for k, v in parts)

    def lines(self) -> list[str]:
        hist = (
            f"history {tokens(self.histories[0])}"
            if len(self.histories) == 1
            else f"histories {', '.join(map(tokens, self.histories))} pooled"
        )
        best = self.levels[self.best]
        star = "*" if self.flagged.get(self.best) else ""
        if self.decided:
            head = f"fastest flow: {self.best}"
        else:
            head = f"fastest flow: not determined between {', '.join([self.best, *self.tied])}"
        head = (
            f"{self.label} · {self.kind} ({hist}): {head}; {self.best} mean TTFT "
            f"{best.interval('{:,.0f}', signed=False)}{star} ({LATER})"
        )
        tail = [
            f"{flow} {v.interval('{:+,.0f}')} vs {self.best}"
            + ("" if v.decided else f" ({v.status.value}: {v.why()})")
            for flow, v in self.versus.items()
        ]
        if self.routes:
            tail.append(f"decode_first routes ({LATER}): {self.route_shares()}")
        for flow, (n, total) in self.diverged.items():
            tail.append(
                f"{flow}: {n} of {total} turns ({LATER}) recomputed, not pulled: the prompt no "
                "longer began with the tokens D held (history edited; recompute_diverged)"
            )
        for flow, (n, total) in self.expired.items():
            tail.append(
                f"{flow}: {n} of {total} turns ({LATER}) recomputed, not pulled: D's lease on "
                "the history had run out (recompute_expired; raise flow.decoder_kv_blocks_ttl_s)"
            )
        tail += self.notes
        return [head + "".join(f"\n  {t}" for t in tail)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for flow, lv in self.levels.items():
            vs = self.versus.get(flow)
            rows.append(
                {
                    "deployment": self.label,
                    "kind": self.kind,
                    "history": ", ".join(map(tokens, self.histories)),
                    "flow": flow,
                    f"mean TTFT, {LATER} (95% CI)": lv.interval(signed=False)
                    + ("*" if self.flagged.get(flow) else ""),
                    "repetitions": lv.repetitions,
                    "requests": lv.requests,
                    "fastest": self.best,
                    "vs the fastest (95% CI)": "–" if flow == self.best else vs.interval(),
                    "verdict": "" if vs is None else vs.status.value,
                    "routes": self.route_shares() if flow == "decode_first" else "",
                }
            )
        return {"flows": rows}

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.label,
            "kind": self.kind,
            "histories": self.histories,
            "fastest_flow": self.best,
            "decided": self.decided,
            "tied_with": self.tied,
            "levels": {f: v.to_dict() for f, v in self.levels.items()},
            "versus_fastest": {f: v.to_dict() for f, v in self.versus.items()},
            "decode_first_routes": self.routes,
            "recompute_diverged": {f: {"turns": n, "of": t} for f, (n, t) in self.diverged.items()},
            "recompute_expired": {f: {"turns": n, "of": t} for f, (n, t) in self.expired.items()},
            "text": self.lines()[0],
        }


def parse_paths(text: Any) -> dict[str, int]:
    """``"decode_first:2, pull:2"`` (``load.turn_rows``) -> ``{"decode_first": 2, "pull": 2}``."""
    out: dict[str, int] = {}
    for part in str(text or "").split(","):
        name, _, count = part.strip().rpartition(":")
        if name and count.strip().isdigit():
            out[name] = out.get(name, 0) + int(count)
    return out


def routes(data: RunData, point_ids) -> dict[str, int]:
    """Routes of the turns >= 2 of these Points (``by_turn`` paths)."""
    ids = set(point_ids)
    out: dict[str, int] = {}
    turns = data.turns
    if len(turns) and "paths" in turns:
        for text in turns[turns["point_id"].isin(ids) & (turns["turn"] >= 2)]["paths"]:
            for k, v in parse_paths(text).items():
                out[k] = out.get(k, 0) + v
    return out


def asked(points: pd.DataFrame) -> bool:
    """Does this deployment's set of Points ask which flow is best?"""
    flows = points["flow"].nunique()
    kinds = points.groupby("kind")["flow"].nunique()
    return flows >= 3 or (flows >= 2 and int((kinds >= 2).sum()) >= 2)


def answer(ctx: Context) -> list[FlowsAnswer]:
    data = ctx.data
    ok = data.ok_points
    if not len(ok):
        return []
    req = ctx.requests
    later = req[req["turn"] >= 2] if len(req) else req
    out = []
    for dep_id in sorted(ok["deployment_id"].unique()):
        pts = ok[ok["deployment_id"] == dep_id]
        if not asked(pts):
            continue
        for kind in sorted(pts["kind"].fillna("").unique()):
            if str(kind).startswith("trace"):
                continue  # a replayed trace: analysis/questions/replay.py answers for it
            mine = pts[pts["kind"].fillna("") == kind]
            rows = later[(later["deployment_id"] == dep_id) & (later["kind"] == kind)]
            if mine["flow"].nunique() < 2 or not len(rows):
                continue
            out.append(_answer(data, dep_id, kind, mine, rows))
    return out


def _answer(data: RunData, dep_id: str, kind: str, pts: pd.DataFrame, rows) -> FlowsAnswer:
    flows = [f for f in plotkit.ordered(pts["flow"]) if (rows["flow"] == f).any()]
    levels = {f: level(rows[rows["flow"] == f]) for f in flows}
    best = min(flows, key=lambda f: levels[f].estimate)
    versus = {
        f: paired_difference(rows[rows["flow"] == f], rows[rows["flow"] == best], PAIR_KEY)
        for f in flows
        if f != best
    }
    flagged = {
        f: bool((pts[pts["flow"] == f]["flag_count"] > 0).any()) if "flag_count" in pts else False
        for f in flows
    }
    missing = [f for f in plotkit.ordered(pts["flow"]) if f not in flows]
    notes = [f"no ok requests of {LATER} for {', '.join(missing)}"] if missing else []
    df_ids = pts[pts["flow"] == "decode_first"]["point_id"]
    diverged, expired = {}, {}
    for flow in ("pull", "decode_first"):
        taken = routes(data, pts[pts["flow"] == flow]["point_id"])
        if taken.get(DIVERGED):
            diverged[flow] = (taken[DIVERGED], sum(taken.values()))
        if taken.get(EXPIRED):
            expired[flow] = (taken[EXPIRED], sum(taken.values()))
    return FlowsAnswer(
        deployment_id=dep_id,
        label=deployment_label(dep_id, data.points),
        kind=kind or "?",
        histories=sorted(int(h) for h in pts["history_tokens"].unique()),
        levels=levels,
        best=best,
        versus=versus,
        flagged=flagged,
        routes=routes(data, df_ids) if len(df_ids) else {},
        diverged=diverged,
        expired=expired,
        notes=notes,
    )


def _bars(ax, answers: list[FlowsAnswer]) -> None:
    """Mean TTFT per flow (bars, 95% CI) per workload kind (groups)."""
    flows = plotkit.ordered(f for a in answers for f in a.levels)
    width = 0.8 / max(len(flows), 1)
    values = []
    for i, flow in enumerate(flows):
        pts = [(j, a.levels[flow], a) for j, a in enumerate(answers) if flow in a.levels]
        xs = [j + (i - (len(flows) - 1) / 2) * width for j, _, _ in pts]
        ys = [v.estimate for _, v, _ in pts]
        values += ys
        bars = ax.bar(xs, ys, width=width, color=plotkit.FLOW_COLORS.get(flow), label=flow)
        plotkit.errorbars(
            ax,
            xs,
            ys,
            [v.low for _, v, _ in pts],
            [v.high for _, v, _ in pts],
            fmt="none",
            ecolor="k",
            elinewidth=0.8,
            capsize=2,
        )
        for bar, (_, _, a) in zip(bars, pts, strict=True):
            if a.flagged.get(flow):
                bar.set_edgecolor(plotkit.FLAG_EDGE)
                bar.set_hatch("//")
            elif flow == a.best and a.decided:
                bar.set_edgecolor("black")
                bar.set_linewidth(2.0)
    ax.set_xticks(range(len(answers)))
    ax.set_xticklabels(
        [f"{a.kind}\nhistory {', '.join(map(tokens, a.histories))}" for a in answers], fontsize=8
    )
    log = plotkit.log_y(ax, values)
    ax.set_ylabel(f"mean TTFT, {LATER} (ms{', log scale' if log else ''})")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=min(len(flows), 6), loc="upper center")


def _routes(ax, answers: list[FlowsAnswer]) -> None:
    """decode_first: the share of turns >= 2 per route, one stacked bar per kind."""
    have = [a for a in answers if a.routes]
    names = sorted({r for a in have for r in a.routes}, key=lambda r: (r != "decode_first", r))
    left = np.zeros(len(have))
    for r in names:
        share = np.array([a.routes.get(r, 0) / sum(a.routes.values()) for a in have])
        bars = ax.barh(
            range(len(have)), share, left=left, color=plotkit.ROUTE_COLORS.get(r), label=r
        )
        ax.bar_label(
            bars,
            labels=[f"{s:.0%}" if s >= 0.08 else "" for s in share],
            label_type="center",
            fontsize=8,
            color="white",
        )
        left += share
    ax.set_yticks(range(len(have)))
    ax.set_yticklabels([a.kind for a in have], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel(f"share of decode_first's turns ({LATER})")
    ax.invert_yaxis()
    ax.set_title("decode_first: route taken", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=len(names))


def flows_by_workload(plt, answers: list[FlowsAnswer], ctx: Context):
    if not answers:
        return None
    by_dep: dict[str, list[FlowsAnswer]] = {}
    for a in answers:
        by_dep.setdefault(a.label, []).append(a)
    with_routes = any(a.routes for a in answers)
    cols = 2 if with_routes else 1
    fig, axes = plt.subplots(
        len(by_dep),
        cols,
        figsize=(7.0 + 3.8 * (cols - 1), 4.4 * len(by_dep)),
        squeeze=False,
        gridspec_kw={"width_ratios": [2, 1][:cols]},
    )
    for (label, mine), row in zip(by_dep.items(), axes, strict=True):
        _bars(row[0], mine)
        row[0].set_title(label, fontsize=9)
        if with_routes:
            if any(a.routes for a in mine):
                _routes(row[1], mine)
            else:
                row[1].set_visible(False)
    fig.suptitle(f"Mean TTFT per flow per workload ({LATER}; 95% CI; bold: decided fastest)")
    return fig


QUESTION = Question(
    name="flows",
    title="Which flow?",
    answer=answer,
    plots=(
        PlotSpec(
            "flows_by_workload",
            "TTFT per flow per workload",
            flows_by_workload,
            "turns >= 2 per flow and workload kind, 95% CI; right: decode_first's routes",
        ),
    ),
    method=(
        "<b>Which flow</b>: mean TTFT of turns &ge; 2 per flow (each repetition weighing the "
        "same), and the fastest flow's paired difference with each other flow (same "
        "conversations and turns) with its 95% CI; the fastest is decided only when all "
        "of those exclude 0."
    ),
)
