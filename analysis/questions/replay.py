"""Which flow serves this traffic? (``workload=trace``: a user's trace replayed)

Per deployment, every flow replayed the same trace (the same conversations, turn order and
offered times; each repetition its own token ids) in randomized blocks. Per flow and
repetition (one Point, every turn it sent): TTFT p50 and p90, TPOT p90, goodput (the share
of turns meeting both SLOs, ``slo.ttft_ms`` and ``slo.tpot_ms``; a failed turn meets
neither), the share of turns P pulled, and of those a pulling flow had to recompute because
D's lease had run out (the pause between turns outlasted it) or because the client's
history no longer began with D's tokens. Each figure's interval is Student-t over the
repetitions. The fastest flow is the one with the lowest mean TTFT p90; it is named only
where its paired difference (by repetition: ``other / fastest - 1``) to every other flow
excludes 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit import plotkit
from analysis.load.runs import deployment_label
from analysis.method.deployment import Context
from analysis.questions.policy_check import Estimate, cells_of, run_slo
from analysis.questions.question import PlotSpec, Question

TRACE = "trace"


@dataclass
class ReplayAnswer:
    label: str
    trace: str  # the file replayed (name), with its format
    slo: dict[str, float]
    cells: pd.DataFrame  # flow repetition ttft_p50 ttft_p90 tpot_p90 goodput pulled ...
    notes: list[str] = field(default_factory=list)

    def flows(self) -> list[str]:
        means = self.cells.groupby("flow")["ttft_p90"].mean().sort_values()
        return [str(f) for f in means.index]

    def summary(self, flow: str, column: str) -> Estimate:
        return Estimate.of(self.cells[self.cells["flow"] == flow][column])

    def against(self, best: str, other: str) -> Estimate:
        """TTFT p90 of ``other`` relative to ``best``, paired by repetition."""
        c = self.cells
        a = c[c["flow"] == best].set_index("repetition")["ttft_p90"]
        b = c[c["flow"] == other].set_index("repetition")["ttft_p90"]
        both = a.index.intersection(b.index)
        return Estimate.of([b[r] / a[r] - 1.0 for r in both if a[r] > 0])

    def fastest(self) -> str | None:
        """The flow whose TTFT p90 is lower than every other's (each interval above 0)."""
        flows = self.flows()
        if len(flows) < 2:
            return None
        best = flows[0]
        for other in flows[1:]:
            d = self.against(best, other)
            if d.low is None or d.low <= 0:
                return None
        return best

    def lines(self) -> list[str]:
        flows, best = self.flows(), self.fastest()
        if best is not None:
            worst = max(flows[1:], key=lambda f: self.summary(f, "ttft_p90").value)
            runner = flows[1]
            head = (
                f"fastest flow for this traffic: {best} (TTFT p90 "
                f"{self.summary(best, 'ttft_p90').text('{:,.0f}')} ms; {runner} "
                f"{self.against(best, runner).text('{:+.0%}')}, {worst} "
                f"{self.against(best, worst).text('{:+.0%}')})"
            )
        else:
            head = (
                f"fastest flow for this traffic: not determined between {', '.join(flows)} "
                f"(lowest TTFT p90: {flows[0]} {self.summary(flows[0], 'ttft_p90').text('{:,.0f}')}"
                " ms; the paired intervals hold 0)"
            )
        out = [f"{self.label} · trace {self.trace}: {head}"]
        for flow in flows:
            pulled = self.summary(flow, "pulled").value
            lost = self.summary(flow, "expired").value
            diverged = self.summary(flow, "diverged").value
            out.append(
                f"  {flow:<12} TTFT p50 {self.summary(flow, 'ttft_p50').text('{:,.0f}')} ms, "
                f"p90 {self.summary(flow, 'ttft_p90').text('{:,.0f}')} ms; TPOT p90 "
                f"{self.summary(flow, 'tpot_p90').value:,.1f} ms; goodput "
                f"{self.summary(flow, 'goodput').text('{:.2f}')}; turns pulled {pulled:.0%}"
                + (f", lease expired {lost:.0%}" if lost else "")
                + (f", history diverged {diverged:.0%}" if diverged else "")
            )
        slo = ", ".join(f"{k} {v:g}" for k, v in self.slo.items() if v) or "none set"
        out.append(f"  (every turn of the replay; 95% intervals over repetitions; SLOs {slo})")
        out += [f"  {n}" for n in self.notes]
        return ["\n".join(out)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows = [
            {
                "deployment": self.label,
                "trace": self.trace,
                "flow": flow,
                "TTFT p50 ms (95% CI)": self.summary(flow, "ttft_p50").text("{:,.0f}"),
                "TTFT p90 ms (95% CI)": self.summary(flow, "ttft_p90").text("{:,.0f}"),
                "TPOT p90 ms": self.summary(flow, "tpot_p90").text("{:,.1f}"),
                "goodput share": self.summary(flow, "goodput").text("{:.2f}"),
                "goodput turns/s": self.summary(flow, "goodput_rps").text("{:.2f}"),
                "pulled": f"{self.summary(flow, 'pulled').value:.0%}",
                "lease expired": f"{self.summary(flow, 'expired').value:.0%}",
                "history diverged": f"{self.summary(flow, 'diverged').value:.0%}",
            }
            for flow in self.flows()
        ]
        return {"replay": rows}

    def to_dict(self) -> dict[str, Any]:
        def est(flow: str, column: str) -> dict[str, Any]:
            e = self.summary(flow, column)
            return {"value": e.value, "low": e.low, "high": e.high, "repetitions": e.n}

        columns = ("ttft_p50", "ttft_p90", "tpot_p90", "goodput", "pulled", "expired")
        return {
            "deployment": self.label,
            "trace": self.trace,
            "fastest": self.fastest(),
            "slo": self.slo,
            "flows": {f: {c: est(f, c) for c in columns} for f in self.flows()},
            "notes": self.notes,
        }


def trace_name(ctx: Context) -> str:
    """The replayed file's name and format, from the runs' manifests."""
    names = []
    for manifest in ctx.data.manifests.values():
        traffic = manifest.traffic or {}  # the replay's record (pdbench.traffic.replay)
        if traffic.get("path"):
            names.append(f"{Path(traffic['path']).name} ({traffic.get('format', '?')})")
    return ", ".join(dict.fromkeys(names)) or "?"


def answer(ctx: Context) -> list[ReplayAnswer]:
    req, pts = ctx.data.requests, ctx.data.ok_points
    if not len(req) or not len(pts) or "kind" not in pts:
        return []
    replayed = pts[pts["kind"].fillna("").astype(str).str.startswith(TRACE)]
    if not len(replayed) or replayed["flow"].nunique() < 2:
        return []
    slo, name = run_slo(ctx), trace_name(ctx)
    out = []
    for dep_id in sorted(replayed["deployment_id"].unique()):
        dep_pts = replayed[replayed["deployment_id"] == dep_id]
        mine = req[req["point_id"].isin(set(dep_pts["point_id"]))]
        cells = cells_of(mine, dep_pts, slo, first_turn=1)
        if not len(cells) or cells["flow"].nunique() < 2:
            continue
        notes = []
        if not slo["ttft_ms"] and not slo["tpot_ms"]:
            notes.append("no SLO set (slo.ttft_ms, slo.tpot_ms): goodput counts every turn served")
        if "kept_up" in cells and (cells["kept_up"] == False).any():  # noqa: E712
            late = sorted(set(cells[cells["kept_up"] == False]["flow"]))  # noqa: E712
            notes.append(
                f"{', '.join(late)}: the deployment did not keep up with the trace's times "
                "(turns went out late): latencies there include a growing queue"
            )
        if (cells.groupby("flow")["repetition"].nunique() < 2).any():
            notes.append("one repetition somewhere: no interval there (workload.repetitions=3)")
        out.append(ReplayAnswer(deployment_label(dep_id, pts), name, slo, cells, notes))
    return out


def draw(plt, answers: list[ReplayAnswer], ctx: Context):
    """TTFT p50 and p90 per flow (bars, 95% intervals), one row per deployment."""
    from matplotlib.patches import Patch  # lazy: as pyplot, only when plots are drawn

    fig, axes = plt.subplots(len(answers), 1, figsize=(8, 3.2 * len(answers)), squeeze=False)
    for (ax,), a in zip(axes, answers, strict=True):
        flows = a.flows()
        xs = np.arange(len(flows))
        for offset, column in ((-0.2, "ttft_p50"), (0.2, "ttft_p90")):
            est = [a.summary(f, column) for f in flows]
            values = [e.value for e in est]
            low = [e.value - (e.low if e.low is not None else e.value) for e in est]
            high = [(e.high if e.high is not None else e.value) - e.value for e in est]
            ax.bar(
                xs + offset,
                values,
                0.4,
                yerr=[low, high],
                capsize=3,
                color=[plotkit.FLOW_COLORS.get(f, "tab:gray") for f in flows],
                alpha=0.5 if column == "ttft_p50" else 0.9,
            )
        ax.set_xticks(xs, flows)
        ax.set_ylabel("TTFT (ms)")
        ax.set_title(f"{a.label} · {a.trace}", fontsize=9)
        shades = [Patch(color="tab:gray", alpha=a) for a in (0.5, 0.9)]
        ax.legend(shades, ["TTFT p50", "TTFT p90"], fontsize=8)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


QUESTION = Question(
    name="replay",
    title="Which flow serves this traffic?",
    answer=answer,
    plots=(
        PlotSpec(
            "replay",
            "TTFT p50 and p90 per flow over a replayed trace",
            draw,
            f"{plotkit.CI_NOTE}; lighter bars p50, darker p90",
        ),
    ),
    method=__doc__ or "",
)
