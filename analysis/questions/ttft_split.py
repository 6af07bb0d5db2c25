"""Where does TTFT go? The split per flow and turn (request field ``ttft_split``).

Each request's TTFT is split into router, P queue, P compute, P's pull, the P->D hand-off
and D's first step, plus the residual (TTFT - the parts) that none of them explains;
``split_source`` says whether the parts were measured per request or spread from vLLM's
per-wave histograms. Shown: the mean of each part per (deployment, flow, turn), and, on
the console, one pull turn beside the same turn recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit import plotkit
from analysis.load.runs import SPLIT_PARTS, deployment_label
from analysis.method.deployment import Context
from analysis.questions.question import PlotSpec, Question

PARTS = [p for p in SPLIT_PARTS if p != "residual_ms"]
NAMES = {
    "router_ms": "router",
    "p_queue_ms": "P queue",
    "p_compute_ms": "P compute",
    "p_pull_ms": "P pull",
    "handoff_ms": "hand-off",
    "d_first_step_ms": "D first step",
    "residual_ms": "residual",
}
COLORS = {
    "router_ms": "tab:gray",
    "p_queue_ms": "tab:olive",
    "p_compute_ms": "tab:red",
    "p_pull_ms": "tab:blue",
    "handoff_ms": "tab:purple",
    "d_first_step_ms": "tab:green",
    "residual_ms": "lightgray",
}


@dataclass
class SplitAnswer:
    label: str
    table: pd.DataFrame  # flow turn x ttft_ms <parts> residual_ms n source

    def _row_text(self, r: pd.Series) -> str:
        parts = ", ".join(
            f"{NAMES[p]} {r[p]:,.1f}" for p in PARTS if np.isfinite(r[p]) and abs(r[p]) >= 0.05
        )
        return (
            f"{r['flow']} turn {int(r['turn'])} at {r['x']:,.0f} tokens: {parts}; residual "
            f"{r['residual_ms']:+,.1f} of {r['ttft_ms']:,.1f} ms ({r['source']}, {int(r['n'])} "
            "requests)"
        )

    def lines(self) -> list[str]:
        t = self.table
        pull = t[t["flow"].isin(["pull", "decode_first"]) & (t["turn"] >= 2)]
        pick = pull.sort_values(["x", "turn"]).iloc[-1:] if len(pull) else t.iloc[-1:]
        shown = [self._row_text(r) for _, r in pick.iterrows()]
        if len(pick):
            same = t[
                (t["flow"] == "recompute")
                & (t["turn"] == pick["turn"].iloc[0])
                & (np.isclose(t["x"], pick["x"].iloc[0]))
            ]
            shown += [self._row_text(r) for _, r in same.iterrows()]
        return [f"{self.label}: TTFT split (ms): " + "\n  ".join(shown)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        rows = []
        for _, r in self.table.iterrows():
            row = {
                "deployment": self.label,
                "flow": r["flow"],
                "turn": int(r["turn"]),
                "history": f"{r['x']:,.0f}",
                "TTFT (ms)": f"{r['ttft_ms']:,.1f}",
            }
            row.update({NAMES[p]: f"{r[p]:,.1f}" for p in PARTS})
            row["residual (ms)"] = f"{r['residual_ms']:+,.1f}"
            row["source"] = r["source"]
            row["requests"] = int(r["n"])
            rows.append(row)
        return {"ttft_split": rows}

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.label,
            "rows": self.table.to_dict(orient="records"),
            "text": self.lines()[0],
        }


def split_table(req: pd.DataFrame) -> pd.DataFrame:
    """Mean parts per (deployment, flow, turn, history length) of the requests with a split."""
    cols = [f"split_{p}" for p in SPLIT_PARTS]
    if not len(req) or not set(cols) <= set(req.columns):
        return pd.DataFrame()
    ok = req[req["status"] == "ok"] if "status" in req else req
    ok = ok[ok[cols].notna().any(axis=1)]
    if not len(ok):
        return pd.DataFrame()
    ok = ok.rename(columns={f"split_{p}": p for p in SPLIT_PARTS})
    source = ok["split_source"] if "split_source" in ok else pd.Series("?", index=ok.index)
    ok = ok.assign(source=source.fillna("?").astype(str), x=ok["history_tokens"].astype(float))
    keys = ["deployment_id", "flow", "turn", "point_history_tokens"]
    g = ok.groupby(keys)
    out = g[["x", "ttft_ms", *SPLIT_PARTS]].mean()
    out["n"] = g.size()
    out["source"] = g["source"].agg(lambda s: "/".join(sorted(set(s))))
    return out.reset_index()


def answer(ctx: Context) -> list[Any]:
    table = split_table(ctx.data.requests)
    if not len(table):
        return []
    return [
        SplitAnswer(deployment_label(dep, ctx.data.points), g.drop(columns="deployment_id"))
        for dep, g in table.groupby("deployment_id")
    ]


def ttft_split(plt, answers: list[SplitAnswer], ctx: Context):
    """Stacked mean parts per flow and turn (the longest history length of each)."""
    if not answers:
        return None
    fig, axes = plotkit.grid(plt, len(answers), cols=1, width=9.0, height=3.2)
    for ax, a in zip(axes, answers, strict=True):
        t = a.table
        t = t[t["point_history_tokens"] == t["point_history_tokens"].max()]
        t = t.sort_values(["flow", "turn"])
        labels = [f"{r.flow} t{int(r.turn)} ({r.x:,.0f})" for r in t.itertuples()]
        left = np.zeros(len(t))
        for p in [*PARTS, "residual_ms"]:
            v = np.nan_to_num(t[p].to_numpy(float))
            ax.barh(labels, v, left=left, color=COLORS[p], label=NAMES[p])
            left += v
        ax.set_xlabel("mean TTFT part (ms)")
        ax.set_title(f"{a.label} · longest history", fontsize=9)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, ncol=7, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    fig.suptitle("TTFT split per flow and turn (residual: TTFT - the parts)")
    return fig


QUESTION = Question(
    name="ttft_split",
    supporting=True,
    title="Where does TTFT go?",
    answer=answer,
    plots=(
        PlotSpec(
            "ttft_split",
            "TTFT split",
            ttft_split,
            "router, P queue, P compute, P pull, hand-off, D's first step, residual",
        ),
    ),
    method=(
        "<b>TTFT split</b>: each request's TTFT in router, P queue, P compute, P pull, P-&gt;D "
        "hand-off and D's first step (per request, or per wave from vLLM's histograms: the "
        "source is named); the residual is TTFT minus the parts."
    ),
)
