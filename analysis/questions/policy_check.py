"""Does the deployed policy beat the static thresholds? (the ``policy_check`` preset)

On one deployment the router served the same conversations under ``policy`` (policy.json's
rule per turn, at the load in flight) and under static rules: ``recompute``, ``pull``
(always), ``static_light`` and ``static_heavy`` (the policy's threshold of its lightest and
of its heaviest measured load, at every load), in randomized blocks, at several loads.

Per load, flow and repetition (one Point: its turns >= 2, the only turns where the flows
differ): TTFT p90, TPOT p90, goodput (the share of turns meeting both SLOs, ``slo.ttft_ms``
and ``slo.tpot_ms`` of the run's config; a failed turn meets neither) and goodput per
second (those turns over the Point's wall time). Each figure's interval is Student-t over
the repetitions.

The comparison is paired by repetition (the same conversations under every flow). The
static rule the policy is judged against is chosen without the repetition it is judged on
(leave one out: for repetition r, the static rule with the best mean over the other
repetitions), so the pick's luck does not count for it (the winner's curse). Per
repetition: TTFT p90 as ``policy / best static - 1``, goodput as ``policy - best static``
(share points); their mean over repetitions with a 95% t interval, per load and over all
loads (each repetition's mean over the loads). The verdict: "better" or "worse" where the
interval excludes 0, "as good" where it lies within +-``MARGIN`` (an equivalence, never "the
interval holds 0"), else "undecided".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit import plotkit
from analysis.kit.fmt import LATER
from analysis.load.runs import deployment_label
from analysis.method.deployment import Context
from analysis.method.stats import t_crit
from analysis.questions.question import PlotSpec, Question

POLICY = "policy"
STATIC = ("recompute", "pull", "static_light", "static_heavy")
MARGIN = 0.05  # equivalence: +-5% of TTFT p90, +-5 points of goodput
METRICS = {  # name -> (column, lower is better, relative difference)
    "TTFT p90": ("ttft_p90", True, True),
    "goodput": ("goodput", False, False),
}


@dataclass(frozen=True)
class Estimate:
    """A mean over repetitions with its 95% t interval (low/high None: one repetition)."""

    value: float
    low: float | None
    high: float | None
    n: int

    @classmethod
    def of(cls, values) -> Estimate:
        x = np.asarray([v for v in values if v is not None and np.isfinite(v)], float)
        if not len(x):
            return cls(math.nan, None, None, 0)
        if len(x) < 2:
            return cls(float(x.mean()), None, None, 1)
        half = t_crit(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
        return cls(float(x.mean()), float(x.mean() - half), float(x.mean() + half), len(x))

    def text(self, fmt: str) -> str:
        if not self.n:
            return "no data"
        if self.low is None:
            return f"{fmt.format(self.value)} (one repetition: no interval)"
        return f"{fmt.format(self.value)} [{fmt.format(self.low)}, {fmt.format(self.high)}]"


@dataclass(frozen=True)
class Comparison:
    """The policy against the best static rule on one metric, at one load (None: all)."""

    metric: str
    load: float | None
    difference: Estimate  # relative (TTFT) or in share points (goodput); < 0 faster
    against: dict[str, int]  # static rule -> repetitions it was the one judged against

    @property
    def verdict(self) -> str:
        d, lower_better = self.difference, METRICS[self.metric][1]
        if d.low is None:
            return "undecided"
        better = d.high < 0 if lower_better else d.low > 0
        worse = d.low > 0 if lower_better else d.high < 0
        if better:
            return "better"
        if worse:
            return "worse"
        if d.low >= -MARGIN and d.high <= MARGIN:
            return "as good"
        return "undecided"

    def sentence(self) -> str:
        fmt = "{:+.1%}" if METRICS[self.metric][2] else "{:+.2f}"  # goodput: a share
        d = self.difference
        size = fmt.format(abs(d.value) if self.verdict in ("better", "worse") else d.value)
        interval = d.text(fmt)
        by = ", ".join(f"{k} x{v}" for k, v in sorted(self.against.items()))
        head = {
            "better": f"better by {size.lstrip('+')}",
            "worse": f"worse by {size.lstrip('+')}",
            "as good": f"as good (within +-{MARGIN:.0%})",
            "undecided": "undecided",
        }[self.verdict]
        return f"{head}: policy vs best static {interval} (best static: {by})"

    def to_dict(self) -> dict[str, Any]:
        d = self.difference
        return {
            "metric": self.metric,
            "load": self.load,
            "verdict": self.verdict,
            "difference": d.value,
            "low": d.low,
            "high": d.high,
            "repetitions": d.n,
            "against": self.against,
            "margin": MARGIN,
        }


@dataclass
class PolicyCheckAnswer:
    label: str
    slo: dict[str, float]
    cells: pd.DataFrame  # load flow repetition ttft_p90 tpot_p90 goodput goodput_rps pulled
    comparisons: list[Comparison]
    notes: list[str] = field(default_factory=list)
    load_name: str = "concurrency"  # or "offered turns/s" (open-loop arrivals)

    def flows(self) -> list[str]:
        order = [*STATIC, POLICY]
        return [f for f in order if f in set(self.cells["flow"])]

    def loads(self) -> list[int]:
        return sorted(float(x) for x in self.cells["load"].unique())

    def where(self, load: float) -> str:
        """``concurrency 4`` or ``4 turns/s offered``."""
        if self.load_name == "concurrency":
            return f"concurrency {load:g}"
        return f"{load:g} turns/s offered"

    def summary(self, flow: str, load: float, column: str) -> Estimate:
        c = self.cells[(self.cells["flow"] == flow) & (self.cells["load"] == load)]
        return Estimate.of(c[column])

    def lines(self) -> list[str]:
        def brief(c: Comparison) -> str:
            fmt = "{:+.1%}" if METRICS[c.metric][2] else "{:+.2f}"
            return f"{c.metric} {c.verdict}, {c.difference.text(fmt)}"

        over = [c for c in self.comparisons if c.load is None]
        out = [
            f"{self.label}: the policy vs the best static rule ({LATER}; the best picked on "
            f"the other repetitions): over all loads {'; '.join(brief(c) for c in over)}"
        ]
        for load in self.loads():
            mine = [c for c in self.comparisons if c.load == load]
            pulled = ", ".join(
                f"{f} {self.summary(f, load, 'pulled').value:.0%}" for f in self.flows()
            )
            out.append(
                f"  at {self.where(load)}: {'; '.join(brief(c) for c in mine)}; "
                f"turns pulled: {pulled}"
            )
        slo = ", ".join(f"{k} {v:g}" for k, v in self.slo.items() if v) or "none set"
        out.append(
            f"  (TTFT p90 as policy / best static - 1, goodput as policy - best static share; "
            f'"as good": the interval within +-{MARGIN:.0%}; SLOs {slo})'
        )
        out += [f"  {n}" for n in self.notes]
        return ["\n".join(out)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for load in self.loads():
            for flow in self.flows():
                rows.append(
                    {
                        "deployment": self.label,
                        self.load_name: f"{load:g}",
                        "flow": flow,
                        "TTFT p90 ms (95% CI)": self.summary(flow, load, "ttft_p90").text(
                            "{:,.0f}"
                        ),
                        "TPOT p90 ms": self.summary(flow, load, "tpot_p90").text("{:,.1f}"),
                        "goodput share": self.summary(flow, load, "goodput").text("{:.2f}"),
                        "goodput turns/s": self.summary(flow, load, "goodput_rps").text("{:.2f}"),
                        "pulled": f"{self.summary(flow, load, 'pulled').value:.0%}",
                    }
                )
        verdicts = [
            {
                "deployment": self.label,
                self.load_name: "all" if c.load is None else f"{c.load:g}",
                "metric": c.metric,
                "verdict": c.verdict,
                "policy vs best static (95% CI)": c.sentence().split(": ", 1)[1],
            }
            for c in self.comparisons
        ]
        return {"policy_check": verdicts, "policy_check_flows": rows}

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.label,
            "slo": self.slo,
            "comparisons": [c.to_dict() for c in self.comparisons],
            "notes": self.notes,
        }


def run_slo(ctx: Context) -> dict[str, float]:
    """The SLOs given to the analysis, else the runs' configs' (the tightest where runs
    differ; 0: none)."""
    out = {"ttft_ms": 0.0, "tpot_ms": 0.0}
    if ctx.slo:
        return {**out, **ctx.slo}
    for manifest in ctx.data.manifests.values():
        slo = manifest.config.get("slo") or {}  # the run config's slo section
        for key in out:
            value = float(slo.get(key) or 0.0)
            if value > 0:
                out[key] = min(out[key], value) if out[key] > 0 else value
    return out


def load_of(point: pd.Series) -> float:
    """A Point's load: its offered rate (turns/s) in an open loop, else its concurrency."""
    open_loop = "arrival" in point.index and str(point["arrival"]) != "waves"
    if open_loop:  # a frame of Points (load.point_row) has it; a hand-made one may not
        return float(point["request_rate"] or 0.0)
    return float(point["concurrency"])


def load_name(points: pd.DataFrame) -> str:
    open_loop = "arrival" in points and (points["arrival"].astype(str) != "waves").any()
    return "offered turns/s" if open_loop else "concurrency"


def cells_of(
    requests: pd.DataFrame, points: pd.DataFrame, slo: dict[str, float], first_turn: int = 2
) -> pd.DataFrame:
    """One row per (load, flow, repetition): the figures of that Point's turns from
    ``first_turn`` on (2: where flows differ; 1: every turn a replayed trace sent)."""
    meta = points.set_index("point_id")[["concurrency", "started_at", "finished_at"]].copy()
    meta["load"] = [load_of(r) for _, r in points.iterrows()]
    meta["kept_up"] = points["kept_up"].to_numpy() if "kept_up" in points else None
    req = requests[requests["turn"] >= first_turn].join(meta, on="point_id", how="inner")
    rows = []
    for (load, flow, rep, pid), g in req.groupby(
        ["load", "flow", "repetition", "point_id"], sort=True
    ):
        ok = g[g["status"] == "ok"] if "status" in g else g
        ttft = ok["ttft_ms"].astype(float)
        tpot = ok["tpot_ms"].astype(float) if "tpot_ms" in ok else pd.Series(dtype=float)
        met = np.ones(len(ok), bool)
        if slo["ttft_ms"] > 0:
            met &= (ttft <= slo["ttft_ms"]).to_numpy()
        if slo["tpot_ms"] > 0:
            met &= (tpot <= slo["tpot_ms"]).to_numpy()
        wall = float(g["finished_at"].iloc[0] - g["started_at"].iloc[0])
        paths = g["path"].astype(str) if "path" in g else pd.Series([""] * len(g))
        rows.append(
            {
                "load": load,
                "kept_up": g["kept_up"].iloc[0],
                "flow": str(flow),
                "repetition": int(rep),
                "point_id": pid,
                "turns": len(g),
                "ttft_p50": float(np.percentile(ttft, 50)) if len(ttft) else math.nan,
                "ttft_p90": float(np.percentile(ttft, 90)) if len(ttft) else math.nan,
                "tpot_p90": float(np.percentile(tpot[tpot > 0], 90)) if (tpot > 0).any() else 0.0,
                "goodput": float(met.sum()) / len(g),
                "goodput_rps": float(met.sum()) / wall if wall > 0 else math.nan,
                "pulled": float((paths == "pull").mean()),
                "expired": float((paths == "recompute_expired").mean()),
                "diverged": float(paths.str.startswith("recompute_diverged").mean()),
            }
        )
    return pd.DataFrame(rows)


def _metric(cells: pd.DataFrame, flow: str, load: float, column: str) -> dict[int, float]:
    c = cells[(cells["flow"] == flow) & (cells["load"] == load)]
    return dict(zip(c["repetition"].astype(int), c[column].astype(float), strict=True))


def compare(cells: pd.DataFrame, metric: str) -> list[Comparison]:
    """Per load and over all loads: the policy against the static rule that was best on the
    other repetitions (leave one out), paired by repetition."""
    column, lower_better, relative = METRICS[metric]
    statics = [f for f in STATIC if f in set(cells["flow"])]
    per_load: dict[float, dict[int, float]] = {}
    out = []
    for load in sorted(float(x) for x in cells["load"].unique()):
        mine = _metric(cells, POLICY, load, column)
        others = {f: _metric(cells, f, load, column) for f in statics}
        diffs: dict[int, float] = {}
        against: dict[str, int] = {}
        for rep, value in mine.items():
            scores = {}
            for f, by_rep in others.items():
                rest = [v for r, v in by_rep.items() if r != rep and np.isfinite(v)]
                if rest and rep in by_rep:
                    scores[f] = float(np.mean(rest))
            if not scores:
                continue
            pick = min(scores, key=scores.get) if lower_better else max(scores, key=scores.get)
            base = others[pick][rep]
            if relative:
                if not base > 0:
                    continue
                diffs[rep] = value / base - 1.0
            else:
                diffs[rep] = value - base
            against[pick] = against.get(pick, 0) + 1
        per_load[load] = diffs
        out.append(Comparison(metric, load, Estimate.of(diffs.values()), against))
    reps = sorted({r for d in per_load.values() for r in d})
    pooled = [np.mean([d[r] for d in per_load.values() if r in d]) for r in reps]
    total: dict[str, int] = {}
    for c in out:
        for k, v in c.against.items():
            total[k] = total.get(k, 0) + v
    out.insert(0, Comparison(metric, None, Estimate.of(pooled), total))
    return out


def answer(ctx: Context) -> list[PolicyCheckAnswer]:
    req, pts = ctx.data.requests, ctx.data.ok_points
    if not len(req) or not len(pts) or POLICY not in set(pts["flow"]):
        return []
    slo = run_slo(ctx)
    out = []
    for dep_id in sorted(pts[pts["flow"] == POLICY]["deployment_id"].unique()):
        dep_pts = pts[pts["deployment_id"] == dep_id]
        if not set(dep_pts["flow"]) & set(STATIC):
            continue
        cells = cells_of(req[req["point_id"].isin(set(dep_pts["point_id"]))], dep_pts, slo)
        if not len(cells):
            continue
        comparisons = [c for m in METRICS for c in compare(cells, m)]
        notes = []
        if not slo["ttft_ms"] and not slo["tpot_ms"]:
            notes.append("no SLO set (slo.ttft_ms, slo.tpot_ms): goodput counts every turn served")
        if "kept_up" in cells:
            behind = sorted({float(x) for x in cells[cells["kept_up"] == False]["load"]})  # noqa: E712
            if behind:
                rates = ", ".join(f"{x:g}" for x in behind)
                notes.append(
                    f"at {load_name(dep_pts)} {rates}: the deployment did not keep up with the "
                    "open loop (turns went out late): latencies there are a growing queue's"
                )
        reps = cells.groupby(["load", "flow"])["repetition"].nunique()
        if (reps < 3).any():
            notes.append(
                "fewer than 3 repetitions somewhere: the static rule judged against is picked "
                "on 1 repetition there (workload.repetitions=4 or more)"
            )
        label = deployment_label(dep_id, pts)
        out.append(PolicyCheckAnswer(label, slo, cells, comparisons, notes, load_name(dep_pts)))
    return out


def draw(plt, answers: list[PolicyCheckAnswer], ctx: Context):
    """TTFT p90 and goodput against the load, one line per flow, 95% interval bands."""
    fig, axes = plt.subplots(len(answers), 2, figsize=(11, 3.8 * len(answers)), squeeze=False)
    colors = {
        **plotkit.FLOW_COLORS,
        "static_light": "tab:olive",
        "static_heavy": "tab:brown",
        POLICY: "tab:purple",
    }
    for row, a in zip(axes, answers, strict=True):
        for ax, (metric, column) in zip(
            row,
            (("TTFT p90 (ms)", "ttft_p90"), ("goodput (share of turns)", "goodput")),
            strict=True,
        ):
            for flow in a.flows():
                est = [a.summary(flow, x, column) for x in a.loads()]
                xs = a.loads()
                ys = [e.value for e in est]
                color = colors.get(flow)
                ax.plot(xs, ys, marker="o", label=flow, color=color, lw=2 if flow == POLICY else 1)
                top = 1.0 if column == "goodput" else math.inf  # a share: at most 1
                lo = [e.low if e.low is not None else e.value for e in est]
                hi = [min(top, e.high if e.high is not None else e.value) for e in est]
                plotkit.band(ax, xs, lo, hi, color)
            ax.set_xlabel(a.load_name)
            ax.set_ylabel(metric)
            ax.set_xticks(a.loads())
            ax.set_title(f"{metric}, {LATER}", fontsize=9)
        row[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


QUESTION = Question(
    name="policy_check",
    title="Does the deployed policy beat the static thresholds?",
    answer=answer,
    plots=(
        PlotSpec(
            "policy_check",
            "TTFT p90 and goodput per flow against the load",
            draw,
            f"{plotkit.CI_NOTE}; the policy's line is thicker",
        ),
    ),
    method=__doc__ or "",
)
