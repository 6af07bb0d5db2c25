"""What does pull cost the decode node, and which TTL should I run? (``decode_cost`` preset)

With bidirectional pull D keeps each finished turn's KV blocks until P pulls them next turn
or ``decoder_kv_blocks_ttl`` runs out, and P's reads compete with D's decoding. Per cell
(a TTL deployment x a load), pull against recompute on the same conversations, turns >= 2,
each with its 95% interval over the repetitions (``paired_cells``, ``stats``):

- what pull saves P: TTFT(recompute) - TTFT(pull);
- what it costs D: TPOT(pull) - TPOT(recompute) of the requests D decoded (the client's,
  and D's own ``vllm:inter_token_latency_seconds`` mean per Point);
- what D's KV holds: the peak share of D's blocks in use while pull ran, and how long D
  held what it kept last after the load (``decode_bill.release_s``: about the TTL, since
  nobody pulls the last turn);
- pulls lost to the TTL: turns >= 2 the router recomputed because D's lease had run out
  (``recompute_expired``), and the longest wait between a conversation's turns.

The TTL to run is the shortest swept one that lost no pull at any load: a shorter one
loses the saving, a longer one only holds D's blocks longer (never-pulled blocks are held
for the whole TTL: block-seconds per conversation, from the records).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit.fmt import LATER
from analysis.load.runs import deployment_label
from analysis.method import paired_cells as pc
from analysis.method.deployment import Context
from analysis.method.stats import Verdict
from analysis.questions.question import Question

LOST = "recompute_expired"


@dataclass
class CostCell:
    deployment_id: str
    label: str
    kind: str  # the load (workload shape)
    concurrency: int
    ttl_s: float
    saving: Verdict  # TTFT recompute - pull, ms
    tpot_cost: Verdict  # client TPOT pull - recompute, ms
    itl_cost_server: Verdict  # D's own ITL histogram mean, pull - recompute, ms
    kv_peak: Verdict  # peak share of D's KV in use during pull, %
    held_s: Verdict  # last D request's end -> D idle again, s (pull)
    lost_pulls: float  # share of pull's turns >= 2 recomputed for an expired lease
    longest_gap_s: float  # longest wait between a conversation's turns (pull)
    never_pulled_block_s: float  # per conversation, pull flow, mean over repetitions
    released: tuple[int, int] = (0, 0)  # pull Points that saw D idle again, of all

    def held_text(self) -> str:
        """How long D held the blocks; from the Points that saw D idle again only, and said
        so when some did not (without ``flow.kv_tail`` sampling stops with the load)."""
        seen, total = self.released
        if seen == 0:
            return (
                f"a time not measured (D was not seen idle again after any of {total} "
                "Points; flow.kv_tail=true waits for it)"
            )
        held = self.held_s.interval("{:,.1f}", signed=False)
        if seen == total:
            return held
        return (
            f"{held} (D was seen idle again after {seen} of {total} Points; "
            "flow.kv_tail=true waits for it)"
        )

    def sentence(self) -> str:
        return (
            f"pull saves P {self.saving.interval()} of TTFT and costs D "
            f"{self.tpot_cost.interval('{:+,.2f}')} of TPOT and "
            f"{self.kv_peak.interval('{:,.1f}', signed=False)} of its KV for "
            f"{self.held_text()} (TTL {self.ttl_s:g} s, {self.kind})"
        )

    def row(self) -> dict[str, Any]:
        return {
            "deployment": self.label,
            "TTL s": self.ttl_s,
            "load": self.kind,
            f"TTFT saved on P, {LATER} (95% CI)": self.saving.interval(),
            "TPOT cost on D, client (95% CI)": self.tpot_cost.interval("{:+,.2f}"),
            "ITL cost on D, server (95% CI)": self.itl_cost_server.interval("{:+,.2f}"),
            "D KV peak (95% CI)": self.kv_peak.interval("{:,.1f}", signed=False),
            "held after the load (95% CI)": self.held_text(),
            "pulls lost to the TTL": f"{self.lost_pulls:.0%}",
            "longest wait between turns s": round(self.longest_gap_s, 2),
            "never-pulled block-s per conversation": round(self.never_pulled_block_s, 1),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "ttl_s": self.ttl_s,
            "load": self.kind,
            "ttft_saving_ms": self.saving.to_dict(),
            "tpot_cost_ms": self.tpot_cost.to_dict(),
            "itl_cost_server_ms": self.itl_cost_server.to_dict(),
            "kv_peak_pct": self.kv_peak.to_dict(),
            "held_s": self.held_s.to_dict(),
            "released_points": list(self.released),
            "lost_pulls": self.lost_pulls,
            "longest_gap_s": self.longest_gap_s,
            "never_pulled_block_s_per_conversation": self.never_pulled_block_s,
            "text": self.sentence(),
        }


@dataclass
class DecodeCostAnswer:
    cells: list[CostCell]
    ttl_s: float | None  # the TTL to run (None: every swept TTL lost pulls)
    why: str
    notes: list[str] = field(default_factory=list)

    def headline(self) -> CostCell:
        """The recommended TTL's cell at the highest concurrency (any TTL: none kept every pull)."""
        mine = [c for c in self.cells if c.ttl_s == self.ttl_s] or self.cells
        return max(mine, key=lambda c: c.concurrency)

    def card(self) -> str:
        head = self.headline()
        ttl = (
            f"run TTL {self.ttl_s:g} s"
            if self.ttl_s is not None
            else "no swept TTL kept every pull"
        )
        held = (
            "" if head.released[0] == 0 else f" for {head.held_s.interval('{:,.1f}', signed=False)}"
        )
        return (
            f"{ttl}; at concurrency {head.concurrency} pull saves P {head.saving.interval()} of "
            f"TTFT and costs D {head.tpot_cost.interval('{:+,.2f}')} of TPOT and "
            f"{head.kv_peak.interval('{:,.1f}', signed=False)} of its KV{held}."
        )

    def lines(self) -> list[str]:
        head = self.headline()
        ttl = (
            f"run TTL {self.ttl_s:g} s ({self.why})"
            if self.ttl_s is not None
            else f"no swept TTL kept every pull ({self.why})"
        )
        rest = [c.sentence() for c in self.cells if c is not head]
        why = [] if head.saving.decided else [f"saving: {head.saving.why()}"]
        return [
            f"Decode node's bill: {head.sentence()}; {ttl}"
            + "".join(f"\n  {t}" for t in [*why, *rest, *self.notes])
        ]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"decode_cost": [c.row() for c in self.cells]}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ttl_s": self.ttl_s,
            "why": self.why,
            "cells": [c.to_dict() for c in self.cells],
            "text": self.lines()[0],
        }


def _gaps(req: pd.DataFrame) -> pd.Series:
    """Per pull Point: the longest wait between a conversation's consecutive turns (s)."""
    r = req[req["flow"] == "pull"].sort_values(["point_id", "conversation", "turn"])
    if not len(r):
        return pd.Series(dtype=float)
    end = r["start_s"] + r["e2e_ms"] / 1e3
    nxt = r.groupby(["point_id", "conversation"])["start_s"].shift(-1)
    return (nxt - end).groupby(r["point_id"]).max().dropna()


def answer(ctx: Context) -> list[DecodeCostAnswer]:
    data = ctx.data
    pts = data.points
    if not len(pts) or "bill_blocks" not in pts:
        return []
    # Every ok Point with a bill (D's blocks known); how long D held its blocks only where it
    # was seen idle again (release_s >= 0): a Point whose sampling stopped first says nothing
    # of it.
    measured = pts[(pts["status"] == "ok") & (pts["bill_blocks"].fillna(0) > 0)]
    cells = pc.cells(measured, ("pull", "recompute"))
    if not cells:
        return []
    req = pc.request_metrics(data, ("ttft_ms", "tpot_ms", "start_s", "e2e_ms"))
    saving = pc.per_repetition(req, "recompute", "pull", "ttft_ms")
    tpot = pc.per_repetition(req, "pull", "recompute", "tpot_ms")
    itl = pc.point_difference(measured, "pull", "recompute", "bill_itl_ms_server")
    peak = measured.assign(bill_peak_pct=100 * measured["bill_usage_peak"].astype(float))
    peak = pc.point_level(peak, "pull", "bill_peak_pct")
    seen = measured["bill_release_s"].fillna(-1) >= 0
    held = pc.point_level(measured[seen], "pull", "bill_release_s")
    gaps = _gaps(req)
    out = []
    for dep, kind in cells:
        rows = measured[(measured["deployment_id"] == dep) & (measured["kind"] == kind)]
        pull = rows[rows["flow"] == "pull"]
        later = req[
            (req["deployment_id"] == dep)
            & (req["kind"] == kind)
            & (req["flow"] == "pull")
            & (req["turn"] >= 2)
        ]
        conv = pull["conversations"].astype(float).replace(0, np.nan)
        out.append(
            CostCell(
                deployment_id=dep,
                label=deployment_label(dep, pts),
                kind=kind,
                concurrency=int(pull["concurrency"].max()) if len(pull) else 0,
                ttl_s=float(pull["bill_ttl_s"].iloc[0]) if len(pull) else float("nan"),
                saving=pc.verdict(saving, dep, kind),
                tpot_cost=pc.verdict(tpot, dep, kind),
                itl_cost_server=pc.verdict(itl, dep, kind),
                kv_peak=pc.verdict(peak, dep, kind, "%").within(0.0, 100.0),
                held_s=pc.verdict(held, dep, kind, "s").within(0.0),
                lost_pulls=float((later["path"] == LOST).mean()) if len(later) else 0.0,
                longest_gap_s=float(gaps.reindex(pull["point_id"]).max())
                if len(gaps)
                else float("nan"),
                never_pulled_block_s=float(
                    (pull["bill_never_pulled_block_s"].astype(float) / conv).mean()
                ),
                released=(int(seen[pull.index].sum()), len(pull)),
            )
        )
    out.sort(key=lambda c: (c.ttl_s, c.kind))
    return [recommend(out)]


def recommend(cells: list[CostCell]) -> DecodeCostAnswer:
    """The shortest TTL that lost no pull at any load it was measured at."""
    ttls = sorted({c.ttl_s for c in cells if np.isfinite(c.ttl_s)})
    keeps = [t for t in ttls if all(c.lost_pulls == 0 for c in cells if c.ttl_s == t)]
    gap = max((c.longest_gap_s for c in cells if np.isfinite(c.longest_gap_s)), default=0.0)
    if not keeps:
        return DecodeCostAnswer(
            cells, None, f"the longest wait between turns was {gap:,.1f} s: try a longer TTL"
        )
    best = keeps[0]
    why = f"the shortest that lost no pull; the longest wait between turns was {gap:,.1f} s"
    shorter = [t for t in ttls if t < best]
    if shorter:
        lost = ", ".join(f"{c.lost_pulls:.0%} at {c.kind}" for c in cells if c.ttl_s == shorter[-1])
        why += f"; TTL {shorter[-1]:g} s lost pulls: {lost}"
    longer = [c for c in cells if c.ttl_s > best]
    if longer:
        base = {c.kind: c.never_pulled_block_s for c in cells if c.ttl_s == best}
        extra = [c.never_pulled_block_s - base.get(c.kind, np.nan) for c in longer]
        extra = [x for x in extra if np.isfinite(x)]
        if extra:
            why += (
                f"; a longer TTL only holds D's unread blocks longer (+{max(extra):,.0f} "
                "block-s per conversation)"
            )
    return DecodeCostAnswer(cells, best, why)


QUESTION = Question(
    name="decode_cost",
    title="What does pull cost the decode node, and which TTL should I run?",
    answer=answer,
    method=(
        "Pull against recompute on the same conversations (turns >= 2), per TTL deployment and "
        "load: the TTFT P saves, the TPOT D pays (client) and D's own ITL histogram, each the "
        "mean of per-repetition paired differences with its 95% t interval; D's peak KV share "
        "and how long it held its last blocks, from 0.5 s occupancy samples "
        "(<code>decode_bill</code>). The TTL to run: the shortest swept one that lost no pull "
        "to an expired lease (<code>recompute_expired</code>) at any load."
    ),
)
