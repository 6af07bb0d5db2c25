"""Pull or recompute, and from which history length on? (every deployment with both flows)

The measured crossover with its 95% interval (``saving_curve``), the paired saving per
history length with its interval, the predictions (the fits, first principles, and P's
spent costs with whether it lies inside the measured interval), and the
``kv_recompute_threshold`` to set (``deployment.advise_threshold``). A deployment measured
at several concurrencies gets one answer per load, each naming it ("at concurrency 4: ...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from analysis.kit import plotkit
from analysis.kit.fmt import pct, tokens
from analysis.method.deployment import Context, DeploymentAnalysis, LoadAnalysis, ThresholdAdvice
from analysis.method.predict import relative_gap
from analysis.method.pull_recompute import Measured, flow_levels
from analysis.method.saving_curve import Shape
from analysis.method.stats import Status
from analysis.questions.question import Note, PlotSpec, Question, without_parentheses

CELLS_SHOWN = 6  # per-length savings on the console line (all in the report)


@dataclass
class CrossoverAnswer:
    a: DeploymentAnalysis
    load: LoadAnalysis | None = None  # None or the only one: the deployment's measurement

    @property
    def m(self) -> Measured:
        return self.load.measured if self.load else self.a.measured

    @property
    def advice(self) -> ThresholdAdvice:
        return self.load.threshold_advice if self.load else self.a.threshold_advice

    @property
    def at(self) -> str:
        """``at concurrency 4: `` where the deployment ran several loads, else ''."""
        return f"at {self.load.name}: " if self.load and self.a.per_load else ""

    def headline(self) -> str:
        return self.at + self._headline()

    def _headline(self) -> str:
        c = self.m.crossover
        reps = f"{c.repetitions} repetitions, {c.requests:,} paired requests"
        if c.decided and c.shape is Shape.CROSSING:
            return (
                f"pull beats recompute above {c.estimate:,.0f} tokens of history, 95% CI "
                f"{c.interval_text()} (measured between {c.lo:,.0f} and {c.hi:,.0f}; {reps})"
            )
        if c.decided and c.shape in (Shape.FALLING, Shape.MIXED):
            return f"measured: {c.describe()} ({reps})"
        if c.decided:
            return f"measured crossover: none, {c.describe()} ({reps})"
        return f"measured crossover: {c.describe()}"

    def predictions(self) -> str:
        a, est = self.a, self.m.crossover.estimate
        parts = []
        for p, name in ((a.by_fit, "the fits"), (a.by_first_principles, "first principles")):
            gap = relative_gap(p, est)
            vs = f", {pct(gap)} vs measured" if gap is not None else ""
            if a.transfer_lent_by:  # another run dir's bench records: say whose
                vs += f" (transfer from the transfer-bench records of {a.transfer_lent_by})"
            parts.append(f"{p.describe()} by {name}{vs}")
        return "; ".join(parts)

    def spent(self) -> str:
        """The prediction from P's spent costs beside the measured, '' without a split."""
        load = self.load
        if load is None or load.spent.shape is Shape.NO_DATA:
            return ""
        return (
            f"predicted by P's spent costs: {load.spent.describe()} "
            f"({load.spent.costs_text()}): {load.check.text()}"
        )

    def savings(self, limit: int | None = CELLS_SHOWN) -> str:
        cells = self.m.cells
        shown = cells if limit is None or len(cells) <= limit else cells[:: -(-len(cells) // limit)]
        return "; ".join(f"{c.x:,.0f}: {c.saving.interval('{:,.0f}')}" for c in shown)

    def card(self) -> str:
        """The verdict and the action: the threshold to set, where one is decided."""
        c = self.m.crossover
        if c.decided and c.shape is Shape.CROSSING:
            verdict = (
                f"pull beats recompute above {c.estimate:,.0f} tokens of history, "
                f"95% CI {c.interval_text()}"
            )
        else:
            verdict = without_parentheses(self._headline())
        if self.advice.status is Status.DECIDED and self.advice.value is not None:
            action = f"set kv_recompute_threshold to {self.advice.text_short()}"
        else:
            action = f"kv_recompute_threshold: {without_parentheses(self.advice.text())}"
            more = re.search(
                r"about [\d,]+ repetitions[^;()]*would decide it|measure \w[^;()]*", c.reason
            )
            action += f": {more.group(0)}" if more else ""
        return f"{self.a.label}: {self.at}{verdict}; {action}."

    def lines(self) -> list[str]:
        a = self.a
        out = [
            f"{a.label}: {self.headline()}. Predicted: {self.predictions()}.\n"
            f"  recommended kv_recompute_threshold: {self.advice.text()}"
        ]
        if self.spent():
            out[0] += f"\n  {self.spent()}"
        if self.m.cells:
            out[0] += f"\n  saving of pull (recompute - pull, 95% CI) at history: {self.savings()}"
        if self.m.disagreement_text():
            out[0] += f"\n  {self.m.disagreement_text()}"
        return out

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        a, c = self.a, self.m.crossover
        est = c.estimate
        load = self.load
        row = {
            "deployment": a.label,
            **({"concurrency": load.concurrency} if load and a.per_load else {}),
            "measured crossover": c.describe(),
            "verdict": c.status.value,
            "repetitions": c.repetitions,
            "paired requests": c.requests,
            "by fits": a.by_fit.describe(),
            "fits vs measured": pct(relative_gap(a.by_fit, est)),
            "by first principles": a.by_first_principles.describe(),
            "FP vs measured": pct(relative_gap(a.by_first_principles, est)),
            "by P's spent costs": load.spent.describe() if load else "–",
            "spent costs vs measured": load.check.text() if load else "–",
            "recommended threshold": self.advice.text(),
        }
        cells = [
            {
                "deployment": a.label,
                "kind": cell.kind,
                "history (swept)": tokens(cell.history),
                "turn": cell.turn,
                "history at turn": f"{cell.x:,.0f}",
                "TTFT recompute (ms)": f"{cell.recompute_ms:,.1f}",
                "TTFT pull (ms)": f"{cell.pull_ms:,.1f}",
                "saving, 95% CI": cell.saving.interval(),
                "verdict": cell.saving.status.value,
                "repetitions": cell.saving.repetitions,
                "requests": cell.saving.requests,
                "why": cell.saving.why(),
            }
            for cell in self.m.cells
        ]
        return {"crossover": [row], "savings": cells}

    def to_dict(self) -> dict[str, Any]:
        a, load, est = self.a, self.load, self.m.crossover.estimate
        curve = self.m.curve
        return {
            "deployment_id": a.deployment_id,
            "label": a.label,
            "concurrency": load.concurrency if load else None,
            "per_load": a.per_load,
            "measured": self.m.crossover.to_dict(),
            "curve": None
            if curve is None
            else {
                "coef_ms": [float(x) for x in curve.coef],
                "h_scale": curve.scale,
                "degree": curve.degree,
                "alpha_ms": curve.alpha_ms(),
            },
            "savings": [cell.to_dict() for cell in self.m.cells],
            "predicted_fit": a.by_fit.to_dict(),
            "predicted_first_principles": a.by_first_principles.to_dict(),
            "predicted_spent_costs": load.spent.to_dict() if load else None,
            "spent_costs_check": load.check.to_dict() if load else None,
            "fit_vs_measured_rel": relative_gap(a.by_fit, est),
            "first_principles_vs_measured_rel": relative_gap(a.by_first_principles, est),
            "fit_saving_rms_error_ms": a.fit_rms_ms,
            "first_principles_saving_rms_error_ms": a.fp_rms_ms,
            "recommended_kv_recompute_threshold": self.advice.to_dict(),
            "text": self.lines()[0],
        }


def answer(ctx: Context) -> list[Any]:
    out: list[Any] = []
    rest = []
    for a in ctx.deployments():
        one = [x.measured for x in a.loads] if a.per_load else [a.measured]
        why = design_measures_no_crossover(one)
        if why:
            out.append(Note(f"{a.label}: no crossover: {why}", {"deployment": a.label}))
            continue
        if a.per_load:
            out.extend(CrossoverAnswer(a, load) for load in a.loads)
            said = validated_at(a.loads)
            if said:
                out.append(Note(f"{a.label}: {said}", {"deployment": a.label}))
        elif a.measured.crossover.shape is Shape.NO_DATA and not a.measured.cells:
            rest.append(a)
        else:
            out.append(CrossoverAnswer(a, a.loads[0] if a.loads else None))
    if rest:  # deployments without both flows: one shared note
        reasons = sorted({a.measured.crossover.reason or "no data" for a in rest})
        text = (
            f"pull-vs-recompute crossover not measured on {len(rest)} deployment(s) "
            f"({'; '.join(reasons)}); predictions from the fits are in the report"
        )
        out.append(Note(text, {"not_measured": [a.label for a in rest], "reasons": reasons}))
    return out


def _working_set(kind: str) -> str:
    """'8 conv' of a kind that names its conversation count (analysis.load.runs.shape_kinds), ''."""
    found = re.search(r"(\d+) conv", kind)
    return f"{found.group(1)} conv" if found else ""


def _base_kind(kind: str) -> str:
    """The workload kind without the count and load ``shape_kinds`` may add."""
    return re.sub(r" \d+ conv( x\d+)?$", "", kind)


def design_measures_no_crossover(measured: list[Measured]) -> str:
    """Why a run's design gives no crossover ('' when it does): one history length at every
    turn, or several workload kinds (working sets) whose savings one curve would pool."""
    if not any(m.cells for m in measured):
        return ""
    for m in measured:
        kinds = sorted({_base_kind(c.kind) for c in m.cells})
        sets = sorted({n for c in m.cells if (n := _working_set(c.kind))})
        if len(kinds) < 2 and len(sets) < 2:
            continue
        what = (
            f"{len(sets)} working sets ({', '.join(sets)})"
            if len(sets) > 1
            else (f"{len(kinds)} workload kinds ({'; '.join(kinds)})")
        )
        return (
            f"the saving was measured for {what}, each at its own lengths: one curve over "
            "all of them would mix them (+experiment=crossover measures one at many lengths)"
        )
    if all(len({round(c.x) for c in m.cells}) < 2 for m in measured):
        return (
            "every turn measured one history length; a crossover needs the saving at two "
            "lengths or more (+experiment=crossover)"
        )
    return ""


def validated_at(loads: list[LoadAnalysis]) -> str:
    """At which loads P's spent costs predicted the crossover inside its measured interval
    ('' when they predicted nothing)."""
    groups: dict[bool | None, list[str]] = {}
    for load in loads:
        if load.spent.shape is not Shape.NO_DATA:
            groups.setdefault(load.check.validated, []).append(str(load.concurrency))
    if not groups:
        return ""
    names = {
        True: "inside the measured 95% interval (validated)",
        False: "outside it",
        None: "not checked (no decided crossover)",
    }
    parts = [f"{names[k]} at concurrency {', '.join(groups[k])}" for k in names if k in groups]
    return "P's spent costs predict the crossover " + "; ".join(parts)


def panels(answers: list[Any], ctx: Context) -> list[CrossoverAnswer]:
    """One plot panel per answer (a deployment, or one of its loads)."""
    mine = [x for x in answers if isinstance(x, CrossoverAnswer)]
    return mine or [CrossoverAnswer(a) for a in ctx.deployments()]


def ttft_vs_history(plt, answers: list[Any], ctx: Context):
    """Mean TTFT per flow at each turn >= 2's history length, with 95% intervals."""
    shown = panels(answers, ctx)
    levels = []
    for x in shown:
        req = x.load.requests(ctx.requests) if x.load else ctx.requests
        lv = flow_levels(req, x.a.deployment_id)
        levels.append(lv[lv["turn"] >= 2])
    if not any(v["x"].nunique() >= 2 for v in levels):
        return None
    fig, axes = plotkit.grid(plt, len(shown))
    for ax, x, rows in zip(axes, shown, levels, strict=True):
        for flow in plotkit.ordered(rows["flow"]):
            f = rows[rows["flow"] == flow].sort_values("x")
            plotkit.errorbars(
                ax,
                f["x"],
                f["ttft_ms"],
                f["low"],
                f["high"],
                fmt="o-",
                ms=3.5,
                color=plotkit.FLOW_COLORS.get(flow),
                label=flow,
            )
        c = x.m.crossover
        if c.estimate is not None and c.shape in (Shape.CROSSING, Shape.FALLING):
            ax.axvline(c.estimate, ls="--", color="k", lw=1, label="measured crossover")
            plotkit.crossover_span(ax, c)
        plotkit.x_scale(ax, rows["x"])
        ax.set_title(x.a.label + (f" · {x.load.name}" if x.at else ""), fontsize=10)
        ax.set_xlabel("history length at the turn (tokens)")
        ax.set_ylabel("mean TTFT (ms)")
        ax.grid(alpha=0.3)
        if len(rows):
            ax.legend(fontsize=8)
    fig.suptitle("TTFT vs history length, per flow (turns >= 2; 95% CIs)")
    return fig


def saving(plt, answers: list[Any], ctx: Context):
    """The paired saving per length with its interval, the fitted curve and its band."""
    shown = [x for x in answers if isinstance(x, CrossoverAnswer) and x.m.cells]
    if not shown:
        return None
    fig, axes = plotkit.grid(plt, len(shown), width=6.0, height=3.9)
    for ax, a in zip(axes, shown, strict=True):
        cells = a.m.cells
        x = np.array([c.x for c in cells])
        est = np.array([c.saving.estimate for c in cells])
        low = np.array([c.saving.low for c in cells])
        high = np.array([c.saving.high for c in cells])
        curve = a.m.curve
        if curve is not None:
            ax.plot(curve.grid, curve.fit, "-", color="tab:blue", lw=1.2, label="fitted saving")
            plotkit.band(ax, curve.grid, curve.low, curve.high, "tab:blue", "pointwise 95% band")
        plotkit.errorbars(
            ax, x, est, low, high, fmt="o", ms=4, color="k", label="measured (per length and turn)"
        )
        ax.axhline(0.0, color="k", lw=0.8)
        c = a.m.crossover
        if c.shape is not Shape.NO_DATA and c.status is not Status.UNDETERMINED:
            plotkit.crossover_span(ax, c)
        ax.set_title(f"{a.a.label}\n{a.at}{c.short()}", fontsize=8)
        logx = plotkit.log_x(ax, x)
        # linear near 0 (where the sign changes), log beyond: both ends readable
        shortest = np.abs(np.concatenate([low[:3], high[:3]]))
        near = float(np.nanmax(shortest)) if np.isfinite(shortest).any() else 0.0
        logy = plotkit.symlog_y(ax, [*est, *high, *low], max(near, 1.0))
        ax.set_xlabel("history length at the turn (tokens" + (", log scale)" if logx else ")"))
        ax.set_ylabel("TTFT recompute - pull (ms" + (", symlog)" if logy else ")"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Saving of pull over recompute (> 0: pull faster), with 95% intervals")
    return fig


QUESTION = Question(
    name="crossover",
    title="Pull or recompute?",
    answer=answer,
    plots=(
        PlotSpec("ttft_vs_history", "TTFT vs history length", ttft_vs_history, plotkit.CI_NOTE),
        PlotSpec(
            "saving",
            "Saving of pull over recompute",
            saving,
            "paired TTFT difference per length (95% CI), the fitted -alpha + b h + c h^2 with "
            "its pointwise 95% band (95% at each length, not for the whole curve at once); "
            "grey: the crossover's 95% interval",
        ),
    ),
    method=(
        "<b>Measured crossover</b>: each turn &ge; 2 of <code>recompute</code> is paired with "
        "the same conversation's same turn of <code>pull</code> (same repetition, same tokens); "
        "a repetition's wave means of the saving are fitted with &minus;&alpha; + b&middot;h + "
        "c&middot;h&sup2; (weights 1/TTFT&sup2;). Its pointwise 95% band (95% at each length, "
        "not for the whole curve at once) comes from the spread between "
        "repetitions at each length (t with Satterthwaite df); the crossover's interval is "
        "where the band holds 0. An interval that reaches the measured range's ends, or a "
        "band that holds 0 everywhere, is <i>inconclusive</i>: the threshold is then "
        "<i>not determined</i> and the repetitions that would decide it are estimated. "
        "<b>By P's spent costs</b>: from each request's TTFT split, P's queue + compute + pull "
        "is fitted per load as r0 + r1&middot;h (+ r2&middot;h&sup2;) when recomputing and "
        "p0 + &beta;&middot;h when pulling; a pull pays where t0 + &beta;&middot;h &lt; "
        "r1&middot;h + r2&middot;h&sup2; (t0 = p0 &minus; r0, R_eff = 1/r1), its root with a "
        "bootstrap interval over the repetitions; <i>validated</i> when it lies inside the "
        "measured 95% interval. Several concurrencies: every verdict per load, never pooled."
    ),
)
