"""Were the flows measured alike? The A/A control (turn 1) per deployment.

Turn 1 is identical work in pull and recompute (nothing is cached yet): its paired
difference must be 0 up to noise. Each deployment's control tests pull / recompute in the
shorter and the longer half of its lengths (``pull_recompute.control``) at a level that
shares 5% among every band of every deployment of the run, so a clean run is marked invalid
at most 5% of the time whatever the number of deployments (measured: docs/reading-results.md,
"The A/A control"). An invalid run's answer says so first, summary.json has ``"valid": false``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analysis.kit import plotkit
from analysis.method.deployment import Context, DeploymentAnalysis
from analysis.method.pull_recompute import Control, flow_levels
from analysis.questions.question import PlotSpec, Question


@dataclass
class ControlAnswer:
    label: str
    control: Control

    @property
    def invalid(self) -> bool:
        return self.control.invalid

    def lines(self) -> list[str]:
        return [f"{self.label}: {self.control.line()}"]

    def card(self) -> str:
        if self.invalid:
            return f"{self.label}: A/A control FAILED: the run is INVALID ({self.control.reason})"
        return f"{self.label}: A/A control passes: the flows were measured alike"

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        c, d = self.control, self.control.diff
        bands = zip(c.bands, c.band_verdicts(), strict=True)
        return {
            "control": [
                {
                    "deployment": self.label,
                    "pull - recompute, turn 1 (95% CI)": d.interval(),
                    "relative": f"{c.relative:+.1%}" if c.level_ms else "–",
                    f"pull / recompute by length band ({c.level:.2%} CI)": "; ".join(
                        f"{v.interval('{:+.1f}')} at {b.lengths()}" for b, v in bands
                    ),
                    "repetitions": d.repetitions,
                    "requests": d.requests,
                    "run": "INVALID" if c.invalid else "valid",
                    "why": c.reason,
                }
            ]
        }

    def to_dict(self) -> dict[str, Any]:
        return {"deployment": self.label, **self.control.to_dict()}


def answer(ctx: Context) -> list[ControlAnswer]:
    """One per deployment, or per load where it ran several (``DeploymentAnalysis.loads``),
    each judged as one of the run's controls (they share its 5%)."""
    tested = [
        (f"{a.label} · {load.name}" if a.per_load else a.label, load.measured.control)
        for a in ctx.deployments()
        for load in a.loads
        if load.measured.control is not None
    ]
    return [ControlAnswer(label, c.judged(len(tested))) for label, c in tested]


def invalid_lines(answers: list[ControlAnswer]) -> list[str]:
    """The headline of an invalid run (printed before everything else)."""
    bad = [a for a in answers if a.invalid]
    if not bad:
        return []
    names = "; ".join(f"{a.label} ({a.control.reason})" for a in bad)
    return [
        f"INVALID RUN: the A/A control (turn 1, identical work in pull and recompute) "
        f"failed on {len(bad)} deployment(s): {names}. Its verdicts below are not evidence."
    ]


def ttft_by_turn(plt, answers: list[Any], ctx: Context):
    """Mean TTFT by turn per flow with 95% intervals (turn 1: the control)."""
    panels: list[tuple[DeploymentAnalysis, int, Any]] = []
    for a in ctx.deployments():
        lv = flow_levels(ctx.requests, a.deployment_id)
        hs = sorted(lv["h"].unique())
        if len(hs) > 3:  # the shortest, a middle and the longest swept history
            hs = [hs[0], hs[len(hs) // 2], hs[-1]]
        panels.extend((a, int(h), lv[lv["h"] == h]) for h in hs)
    if not panels:
        return None
    fig, axes = plotkit.grid(plt, len(panels), cols=3 if len(panels) > 4 else 2)
    for ax, (a, h, rows) in zip(axes, panels, strict=True):
        flows = plotkit.ordered(rows["flow"])
        width = 0.8 / max(len(flows), 1)
        for i, flow in enumerate(flows):
            f = rows[rows["flow"] == flow].groupby("turn").mean(numeric_only=True).reset_index()
            xs = f["turn"] + (i - (len(flows) - 1) / 2) * width
            ax.bar(xs, f["ttft_ms"], width=width, color=plotkit.FLOW_COLORS.get(flow), label=flow)
            plotkit.errorbars(
                ax,
                xs,
                f["ttft_ms"],
                f["low"],
                f["high"],
                fmt="none",
                ecolor="k",
                elinewidth=0.8,
                capsize=2,
            )
        ax.set_xticks(sorted(rows["turn"].unique()))
        log = plotkit.log_y(ax, rows["ttft_ms"])
        ax.set_title(f"{a.label}\nprefix {h:,} tokens before turn 1", fontsize=9)
        ax.set_xlabel("turn")
        ax.set_ylabel("mean TTFT (ms" + (", log scale)" if log else ")"))
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, ncol=len(flows), loc="upper center")
    fig.suptitle("TTFT by turn, per flow (turn 1: nothing to pull yet, the A/A control)")
    return fig


QUESTION = Question(
    name="control",
    title="Were the flows measured alike? (A/A control)",
    answer=answer,
    plots=(PlotSpec("ttft_by_turn", "TTFT by turn", ttft_by_turn, plotkit.CI_NOTE),),
    method=(
        "<b>A/A control</b>: turn 1 does the same work in pull and recompute. Per band of "
        "history lengths (the shorter and the longer half), the mean log ratio pull / "
        "recompute over the repetitions (each length weighing the same) must hold 0 at a level "
        "that shares 5% among every band of every deployment (Bonferroni): a clean run is "
        "marked INVALID at most 5% of the time. The ms difference over all lengths (95% CI) "
        "is shown beside it."
    ),
)
