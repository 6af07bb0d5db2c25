"""Which ``kv_recompute_threshold``? (the ``threshold_sweep`` preset)

Deployments that differ only by ``kv_recompute_threshold`` form a family. Per family and
per flow the threshold matters to (``pull``, ``decode_first``): the mean TTFT of turns
>= 2 at each (threshold, swept history length) with its 95% interval. Each length is
scored against its fastest threshold (TTFT / fastest TTFT) and the best threshold has the
lowest geometric mean of those ratios over the lengths every threshold measured, so no
single length dominates the way a sum of milliseconds would let the longest one.

Against every other threshold, the best one's paired relative difference (same
repetition, conversation and turn; the geometric mean over lengths of TTFT(other) /
TTFT(best), each repetition weighing the same): the best is decided only when all of those
exclude 0. The best is picked by the same data, and a threshold picked for looking fastest
tends to look faster than it is (the winner's curse): tested against itself at 95%, it
would be called best too often. So the intervals are simultaneous over every pair of the
``K`` thresholds (Bonferroni: each at ``1 - 0.05 / (K (K - 1) / 2)``): they hold every
pairwise difference at once with 95%, so whichever threshold the data picked, its
comparisons keep their level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit import plotkit
from analysis.kit.fmt import LATER, tokens
from analysis.load.runs import deployment_label
from analysis.method.compare import families, pulled_share, unmatched
from analysis.method.deployment import Context
from analysis.method.pairs import PAIR_KEY
from analysis.method.pull_recompute import level, paired_difference
from analysis.method.stats import LEVEL, Verdict
from analysis.questions.question import Note, PlotSpec, Question

THRESHOLD_FLOWS = ("pull", "decode_first")
THRESHOLD_AXES = ("kv_recompute_threshold",)


def _number(value: Any) -> Any:
    """1024.0 -> 1024 (a column with a missing threshold turns to floats)."""
    try:
        return int(value) if float(value).is_integer() else float(value)
    except (TypeError, ValueError):
        return value


@dataclass
class ThresholdAnswer:
    family: str  # the deployments' label without the threshold
    flow: str
    table: pd.DataFrame  # threshold h ttft_ms low high repetitions n pulled_share flagged
    histories: list[int]  # the lengths every threshold measured (scored)
    scores: dict[Any, float]  # threshold -> geometric mean of TTFT / fastest TTFT
    best: Any
    versus: dict[Any, Verdict]  # other threshold -> its TTFT vs the best's, %
    notes: list[str] = field(default_factory=list)
    level: float = LEVEL  # the versus intervals' level (simultaneous 95% over all pairs)

    @property
    def decided(self) -> bool:
        return bool(self.versus) and all(v.decided for v in self.versus.values())

    @property
    def tied(self) -> list[Any]:
        return [t for t, v in self.versus.items() if not v.decided]

    def lines(self) -> list[str]:
        if self.decided:
            head = f"best kv_recompute_threshold: {self.best}"
        else:
            names = ", ".join(map(str, [self.best, *self.tied]))
            head = f"best kv_recompute_threshold: not determined between {names}"
        at = []
        for h in self.histories:
            c = self.table[(self.table["threshold"] == self.best) & (self.table["h"] == h)]
            if len(c):
                r = c.iloc[0]
                how = route(r["pulled_share"])
                at.append(
                    f"{r['ttft_ms']:,.0f} ms [{r['low']:,.0f}, {r['high']:,.0f}] at "
                    f"{tokens(h)}{'*' if r['flagged'] else ''}" + (f", {how}" if how else "")
                )
        head = f"{self.family}, flow {self.flow}: {head} (mean TTFT, {LATER}: {'; '.join(at)})"
        others = [
            f"{t} {v.interval('{:+,.0f}')}" + ("" if v.decided else f" ({v.status.value})")
            for t, v in sorted(self.versus.items(), key=lambda kv: kv[1].estimate)
        ]
        tail = []
        if others:
            joined = "; ".join(others)
            tail.append(
                f"others vs the best (TTFT, geometric mean over lengths; {self.level:.1%} "
                f"intervals, 95% for every pair of thresholds at once, as the best was picked "
                f"from these data): {joined}"
            )
        tail += self.notes
        return [head + "".join(f"\n  {t}" for t in tail)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for thr in sorted(self.scores, key=lambda t: (self.scores[t], t)):
            row: dict[str, Any] = {"deployments": self.family, "flow": self.flow, "threshold": thr}
            for h in sorted(self.table["h"].unique()):
                c = self.table[(self.table["threshold"] == thr) & (self.table["h"] == h)]
                row[f"h {tokens(h)}"] = "–" if not len(c) else _cell(c.iloc[0])
            v = self.versus.get(thr)
            row[f"vs best ({self.level:.1%} CI, simultaneous)"] = (
                "best" if thr == self.best else v.interval()
            )
            rows.append(row)
        return {"threshold": rows}

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployments": self.family,
            "flow": self.flow,
            "best_kv_recompute_threshold": self.best,
            "decided": self.decided,
            "tied_with": self.tied,
            "scores": {str(k): v for k, v in self.scores.items()},
            "versus_best": {str(k): v.to_dict() for k, v in self.versus.items()},
            "versus_level": self.level,
            "table": self.table.rename(columns={"h": "history_tokens"}).to_dict(orient="records"),
            "text": self.lines()[0],
        }


def route(share: float) -> str:
    """What the turns >= 2 did: ``pulled``, ``recomputed`` or ``pulled 40%``."""
    if share != share:
        return ""
    return "pulled" if share >= 1 else "recomputed" if share <= 0 else f"pulled {share:.0%}"


def _cell(r: pd.Series) -> str:
    how = route(r["pulled_share"])
    star = "*" if r["flagged"] else ""
    return f"{r['ttft_ms']:,.1f} [{r['low']:,.1f}, {r['high']:,.1f}]{star}" + (
        f" ({how})" if how else ""
    )


def answer(ctx: Context) -> list[Any]:
    data = ctx.data
    out: list[Any] = []
    shares = pulled_share(data.turns)
    ok = data.ok_points
    for dep_ids in families(data, THRESHOLD_AXES):
        family = deployment_label(dep_ids[0], data.points, omit=("threshold",))
        for flow in THRESHOLD_FLOWS:
            a = _answer(ctx, dep_ids, family, flow, shares, ok)
            if a is not None:
                out.append(a)
    note = unmatched(data, "threshold", THRESHOLD_AXES, bool(out))
    return out + ([Note(note)] if note else [])


def _answer(ctx, dep_ids, family, flow, shares, ok) -> ThresholdAnswer | None:
    req = ctx.requests
    later = req[(req["turn"] >= 2) & (req["flow"] == flow)] if len(req) else req
    by_thr: dict[Any, str] = {}
    rows = []
    for dep in dep_ids:
        pts = ok[(ok["deployment_id"] == dep) & (ok["flow"] == flow)]
        if not len(pts) or pd.isna(pts["threshold"].iloc[0]):
            continue
        thr = _number(pts["threshold"].iloc[0])
        by_thr[thr] = dep
        mine = later[later["deployment_id"] == dep]
        for h in sorted(mine["h"].unique()):
            at_h = mine[mine["h"] == h]
            v = level(at_h)  # a repetition: its requests averaged; t over the repetitions
            at = pts[pts["history_tokens"] == h]
            share = np.nanmean([shares.get(p, np.nan) for p in at["point_id"]]) if len(at) else 0
            flagged = bool((at["flag_count"] > 0).any()) if "flag_count" in at else False
            rows.append(
                {
                    "threshold": thr,
                    "h": h,
                    "ttft_ms": v.estimate,
                    "low": v.low,
                    "high": v.high,
                    "repetitions": v.repetitions,
                    "n": len(at_h),
                    "pulled_share": share,
                    "flagged": flagged,
                }
            )
    if len(by_thr) < 2 or not rows:
        return None
    table = pd.DataFrame(rows).sort_values(["h", "threshold"]).reset_index(drop=True)
    grid = table.pivot_table(index="threshold", columns="h", values="ttft_ms")
    common = [h for h in grid.columns if grid[h].notna().all()]
    scored = grid[common] if common else grid
    ratios = scored / scored.min(axis=0)
    scores = {thr: float(np.exp(np.log(r.dropna()).mean())) for thr, r in ratios.iterrows()}
    best = min(scores, key=lambda t: (scores[t], t))
    mine = later[later["deployment_id"] == by_thr[best]]
    ci_level = simultaneous_level(len(scores))
    versus = {
        thr: paired_difference(
            later[later["deployment_id"] == dep], mine, PAIR_KEY, relative=True, level=ci_level
        )
        for thr, dep in by_thr.items()
        if thr != best and thr in scores
    }
    notes = [] if common else ["no history length was measured at every threshold"]
    histories = [int(h) for h in (common or grid.columns)]
    return ThresholdAnswer(family, flow, table, histories, scores, best, versus, notes, ci_level)


def simultaneous_level(thresholds: int) -> float:
    """Each interval's level so that all pairs of ``thresholds`` hold at once with 95%."""
    pairs = max(thresholds * (thresholds - 1) // 2, 1)
    return 1.0 - (1.0 - LEVEL) / pairs


def ttft_vs_threshold(plt, answers: list[Any], ctx: Context):
    """Filled markers: the turns pulled the history; open squares: they recomputed it."""
    answers = [a for a in answers if isinstance(a, ThresholdAnswer)]
    if not answers:
        return None
    fig, axes = plotkit.grid(plt, len(answers), width=6.6, height=4.2)
    cmap = plt.get_cmap("viridis")
    for ax, a in zip(axes, answers, strict=True):
        t = a.table
        thresholds = sorted(float(x) for x in t["threshold"].unique())
        hs = sorted(t["h"].unique())
        for i, h in enumerate(hs):
            rows = t[t["h"] == h].sort_values("threshold")
            color = cmap(0.1 + 0.75 * i / max(len(hs) - 1, 1))
            plotkit.errorbars(
                ax,
                rows["threshold"],
                rows["ttft_ms"],
                rows["low"],
                rows["high"],
                fmt="-",
                color=color,
                label=f"history {tokens(h)}",
            )
            pulled = rows["pulled_share"].fillna(1.0) > 0
            ax.plot(rows["threshold"][pulled], rows["ttft_ms"][pulled], "o", ms=6, color=color)
            ax.plot(
                rows["threshold"][~pulled],
                rows["ttft_ms"][~pulled],
                "s",
                ms=7,
                mfc="white",
                mec=color,
                mew=1.5,
            )
            bad = rows[rows["flagged"]]
            if len(bad):
                ax.plot(
                    bad["threshold"],
                    bad["ttft_ms"],
                    "o",
                    ms=13,
                    mfc="none",
                    mec=plotkit.FLAG_EDGE,
                    mew=1.5,
                )
        ax.axvline(
            float(a.best),
            ls="--",
            color="k",
            lw=1,
            label=f"best: {a.best}" + ("" if a.decided else " (not decided)"),
        )
        pos = [x for x in thresholds if x > 0]
        if len(pos) >= 2 and pos[-1] / pos[0] >= 8:
            ax.set_xscale("symlog", linthresh=pos[0], linscale=0.6)
        ax.set_xticks(thresholds)
        ax.set_xticklabels([tokens(x) for x in thresholds], fontsize=8)
        ax.minorticks_off()
        log = plotkit.log_y(ax, t["ttft_ms"])
        ax.set_title(f"{a.family} · flow {a.flow}", fontsize=9)
        ax.set_xlabel("kv_recompute_threshold (tokens)")
        ax.set_ylabel(f"mean TTFT, {LATER} (ms{', log' if log else ''})")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"TTFT vs kv_recompute_threshold ({LATER}; 95% CI)")
    return fig


QUESTION = Question(
    name="threshold",
    title="Which kv_recompute_threshold?",
    answer=answer,
    plots=(
        PlotSpec(
            "ttft_vs_threshold",
            "TTFT vs kv_recompute_threshold",
            ttft_vs_threshold,
            "one line per swept history length (95% CI); dashed: the best threshold",
        ),
    ),
    method=(
        "<b>Which threshold</b>: mean TTFT of turns &ge; 2 per threshold and length; the best "
        "has the lowest geometric mean of TTFT / the fastest TTFT over lengths; each other "
        "threshold's paired relative difference with it says whether it is decided, its "
        "interval simultaneous over every pair of thresholds (Bonferroni), so that picking the "
        "best from the same data does not make it look surer than it is."
    ),
)
