"""Which flow serves each workload best? (the ``flows`` preset), pure.

Per deployment and workload kind (``workload.kind``), the TTFT p50 of turns >= 2 of each
flow, pooled over the kind's Points of that flow (one swept history length in the preset;
several are pooled, and the fastest flow per length is given too). The fastest flow is
compared with ``agg`` (the baseline) and ``recompute`` (plain prefill-first P/D). For
``decode_first`` the routes its turns >= 2 took (``by_turn[].paths``: ``decode_first`` when
D held enough of the prompt, else the fallback) are counted.

Asked where a deployment ran three or more flows, or two or more flows on two or more kinds:
a two-flow pull-vs-recompute sweep is the crossover's question.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.compare import (
    FEW_REQUESTS,
    LATER,
    later_requests,
    ms,
    pooled_ttft,
    rel,
    span,
    tokens,
)
from analysis.load import RunData, deployment_label

FLOW_ORDER = ("agg", "recompute", "pull", "decode_first")
BASELINES = ("agg", "recompute")


def ordered(flows) -> list[str]:
    present = list(dict.fromkeys(flows))
    return [f for f in FLOW_ORDER if f in present] + [f for f in present if f not in FLOW_ORDER]


@dataclass
class FlowsAnswer:
    deployment_id: str
    label: str
    kind: str
    histories: list[int]
    table: pd.DataFrame  # flow ttft_ms n flagged points
    best: str
    routes: dict[str, int] = field(default_factory=dict)  # decode_first, turns >= 2
    best_per_history: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def ttft(self, flow: str) -> tuple[float, bool]:
        row = self.table[self.table["flow"] == flow]
        if not len(row):
            return float("nan"), False
        return float(row["ttft_ms"].iloc[0]), bool(row["flagged"].iloc[0])

    def route_shares(self) -> str:
        total = sum(self.routes.values())
        if not total:
            return ""
        parts = sorted(self.routes.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{k} {v}/{total} ({v / total:.0%})" for k, v in parts)

    def versus(self, flow: str) -> str:
        """``-12 ms (-14%) vs agg (87 ms); ...`` for ``flow`` against the baselines."""
        mine, _ = self.ttft(flow)
        out = []
        for base in BASELINES:
            v, flag = self.ttft(base)
            if base != flow and v == v:
                pct = f"{(mine - v) / v:+.0%}" if v else "n/a"
                sign = "+" if mine > v else ""
                out.append(f"{sign}{ms(mine - v)} ({pct}) vs {base} ({ms(v, flag)})")
        return "; ".join(out)

    @property
    def best_pd(self) -> str | None:
        """The fastest disaggregated flow (not ``agg``)."""
        pd_rows = self.table[(self.table["flow"] != "agg") & self.table["ttft_ms"].notna()]
        return str(pd_rows.sort_values("ttft_ms").iloc[0]["flow"]) if len(pd_rows) else None

    def line(self) -> str:
        hist = (
            f"history {tokens(self.histories[0])}"
            if len(self.histories) == 1
            else f"histories {', '.join(map(tokens, self.histories))} pooled"
        )
        head = (
            f"{self.label} · {self.kind} ({hist}): fastest flow: {self.best}, TTFT p50 "
            f"{ms(*self.ttft(self.best))} ({LATER})"
        )
        if self.versus(self.best):
            head += ": " + self.versus(self.best)
        shown = {self.best, *BASELINES}
        pd_best = self.best_pd
        if self.best == "agg" and pd_best and pd_best not in BASELINES:
            head += (
                f". Fastest P/D flow: {pd_best}, {ms(*self.ttft(pd_best))}: {self.versus(pd_best)}"
            )
            shown.add(pd_best)
        others = [f"{f} {ms(*self.ttft(f))}" for f in ordered(self.table["flow"]) if f not in shown]
        if others:
            head += "; " + ", ".join(others)
        tail = []
        if self.best_per_history and len(set(self.best_per_history.values())) > 1:
            per = ", ".join(f"{tokens(h)} -> {f}" for h, f in self.best_per_history.items())
            tail.append(f"fastest per history length: {per}")
        if self.routes:
            tail.append(f"decode_first routes ({LATER}): {self.route_shares()}")
        tail += self.notes
        return head + "".join(f"\n  {t}" for t in tail)


def parse_paths(text: Any) -> dict[str, int]:
    """``"decode_first:2, pull:2"`` (``load.turn_rows``) -> ``{"decode_first": 2, "pull": 2}``."""
    out: dict[str, int] = {}
    for part in str(text or "").split(","):
        name, _, count = part.strip().rpartition(":")
        if name and count.strip().isdigit():
            out[name] = out.get(name, 0) + int(count)
    return out


def routes(data: RunData, point_ids, later: pd.DataFrame) -> dict[str, int]:
    """Routes of the turns >= 2 of these Points: ``by_turn`` paths, else request records."""
    ids = set(point_ids)
    out: dict[str, int] = {}
    turns = data.turns
    if len(turns) and "paths" in turns:
        for text in turns[turns["point_id"].isin(ids) & (turns["turn"] >= 2)]["paths"]:
            for k, v in parse_paths(text).items():
                out[k] = out.get(k, 0) + v
    if not out and len(later):
        paths = later[later["point_id"].isin(ids)]["path"].fillna("").astype(str)
        out = {k: int(v) for k, v in paths[paths != ""].value_counts().items()}
    return out


def asked(points: pd.DataFrame) -> bool:
    """Does this deployment's set of Points ask which flow is best?"""
    flows = points["flow"].nunique()
    kinds = points.groupby("kind")["flow"].nunique()
    return flows >= 3 or (flows >= 2 and int((kinds >= 2).sum()) >= 2)


def flows_answers(data: RunData, later: pd.DataFrame | None = None) -> list[FlowsAnswer]:
    ok = data.ok_points
    if not len(ok):
        return []
    later = later_requests(data) if later is None else later
    out = []
    for dep_id in sorted(ok["deployment_id"].unique()):
        pts = ok[ok["deployment_id"] == dep_id]
        if not asked(pts):
            continue
        label = deployment_label(dep_id, data.points)
        for kind in sorted(pts["kind"].fillna("").unique()):
            mine = pts[pts["kind"].fillna("") == kind]
            if mine["flow"].nunique() < 2:
                continue
            answer = _answer(data, dep_id, label, kind or "?", mine, later)
            if answer is not None:
                out.append(answer)
    return out


def _answer(data, dep_id, label, kind, pts, later) -> FlowsAnswer | None:
    rows = []
    for flow in ordered(pts["flow"]):
        f = pts[pts["flow"] == flow]
        v, n = pooled_ttft(later, f["point_id"])
        flagged = bool((f["flag_count"] > 0).any()) if "flag_count" in f else False
        rows.append({"flow": flow, "ttft_ms": v, "n": n, "flagged": flagged, "points": len(f)})
    table = pd.DataFrame(rows)
    measured = table[table["ttft_ms"].notna()]
    if not len(measured):
        return None
    best = str(measured.sort_values("ttft_ms").iloc[0]["flow"])
    histories = sorted(int(h) for h in pts["history_tokens"].unique())
    per_h: dict[int, str] = {}
    if len(histories) > 1:
        for h in histories:
            at = pts[pts["history_tokens"] == h]
            v = {
                fl: pooled_ttft(later, at[at["flow"] == fl]["point_id"])[0]
                for fl in ordered(at["flow"])
            }
            v = {k: x for k, x in v.items() if x == x}
            if v:
                per_h[h] = min(v, key=v.get)
    notes = []
    if len(measured) and measured["n"].min() < FEW_REQUESTS:
        notes.append(f"{span(measured['n'])} requests per flow: noisy")
    missing = table[table["ttft_ms"].isna()]["flow"].tolist()
    if missing:
        notes.append(f"no ok requests of {LATER} for {', '.join(missing)}")
    df = pts[pts["flow"] == "decode_first"]["point_id"]
    return FlowsAnswer(
        deployment_id=dep_id,
        label=label,
        kind=kind,
        histories=histories,
        table=table,
        best=best,
        routes=routes(data, df, later) if len(df) else {},
        best_per_history=per_h,
        notes=notes,
    )


def flows_rows(answers: list[FlowsAnswer]) -> list[dict[str, Any]]:
    """For the report: one row per (deployment, kind, flow)."""
    rows = []
    for a in answers:
        for _, r in a.table.iterrows():
            base = {b: a.ttft(b)[0] for b in BASELINES}
            rows.append(
                {
                    "deployment": a.label,
                    "kind": a.kind,
                    "history": ", ".join(map(tokens, a.histories)),
                    "flow": r["flow"],
                    f"TTFT p50, {LATER}": ms(r["ttft_ms"], r["flagged"]),
                    "requests": r["n"],
                    "vs agg": "–" if r["flow"] == "agg" else _pct(r["ttft_ms"], base["agg"]),
                    "vs recompute": "–"
                    if r["flow"] == "recompute"
                    else _pct(r["ttft_ms"], base["recompute"]),
                    "fastest": "yes" if r["flow"] == a.best else "",
                    "routes": a.route_shares() if r["flow"] == "decode_first" else "",
                }
            )
    return rows


def _pct(value: float, base: float) -> str:
    if not (value == value and base == base and base):
        return "–"
    return rel(value, base)
