"""From which working set does pulling evicted history back from D pay? (``cache_pressure``)

P keeps prefix caching with a KV cache of ``server.prefill_kv_blocks``; the conversations'
working set is swept past it (``workload.conversations``). While it fits, P finds a
conversation's history in its own cache and there is nothing to pull; once P evicts, the
recompute flow computes the history again and the pull flow brings it back from D, which
still holds it. Per working set (turns >= 2, pull and recompute on the same conversations):

- where each turn's prompt came from, per flow: P's local prefix hits, tokens pulled from D,
  tokens P computed (server counters, ``by_turn``), as shares of the prompt;
- the TTFT pull recovers: TTFT(recompute) - TTFT(pull), mean of per-repetition paired
  differences with its 95% interval (``paired_cells``, ``stats``);
- the working set in P's blocks: conversations x the blocks of a conversation's longest
  prompt plus its output, against ``prefill_kv_blocks``.

Pulling pays from the smallest working set whose recovered TTFT is decided above 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.kit.fmt import LATER
from analysis.load.runs import deployment_label
from analysis.method import paired_cells as pc
from analysis.method.deployment import Context
from analysis.method.stats import Verdict
from analysis.questions.question import Question

SOURCES = ("prefix_hit_tokens", "tokens_pulled", "prefill_tokens_computed")


@dataclass
class WorkingSet:
    kind: str
    conversations: int
    blocks: float  # the working set in P's blocks
    capacity: int  # P's blocks (0: unknown)
    saving: Verdict  # TTFT recompute - pull, ms
    shares: dict[str, dict[str, float]]  # flow -> source -> share of the prompt, turns >= 2

    @property
    def load(self) -> float:
        return self.blocks / self.capacity if self.capacity else math.nan

    def where(self, flow: str) -> str:
        s = self.shares.get(flow) or {}
        return "/".join(f"{s.get(k, 0):.0%}" for k in SOURCES)

    def text(self) -> str:
        size = f"{self.conversations} conversations"
        if self.capacity:
            size += f" ({self.load:.1f}x P's KV)"
        return (
            f"{size}: pull recovers {self.saving.interval()} of TTFT; prompt hit/pulled/"
            f"computed pull {self.where('pull')}, recompute {self.where('recompute')}"
        )

    def row(self, label: str) -> dict[str, Any]:
        return {
            "deployment": label,
            "conversations": self.conversations,
            "working set / P's KV": round(self.load, 2) if self.capacity else "–",
            f"TTFT recovered by pull, {LATER} (95% CI)": self.saving.interval(),
            "pull: hit / pulled / computed": self.where("pull"),
            "recompute: hit / pulled / computed": self.where("recompute"),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "conversations": self.conversations,
            "working_set_blocks": self.blocks,
            "prefill_kv_blocks": self.capacity,
            "ttft_recovered_ms": self.saving.to_dict(),
            "shares": self.shares,
            "text": self.text(),
        }


@dataclass
class EvictionAnswer:
    deployment_id: str
    label: str
    sets: list[WorkingSet]  # by conversations

    @property
    def pays_from(self) -> WorkingSet | None:
        return next((w for w in self.sets if w.saving.decided and w.saving.estimate > 0), None)

    def lines(self) -> list[str]:
        w = self.pays_from
        if w is not None:
            head = (
                f"pulling evicted history back from D pays from {w.conversations} "
                f"conversations on"
                + (f" ({w.load:.1f}x P's KV cache)" if w.capacity else "")
                + f": it recovers {w.saving.interval()} of TTFT per turn there"
            )
        else:
            last = self.sets[-1]
            head = (
                "pulling evicted history back from D did not decidedly pay at any working set "
                f"measured (up to {last.conversations} conversations: "
                f"{last.saving.interval()}; {last.saving.why()})"
            )
        return [f"{self.label}: {head}" + "".join(f"\n  {w.text()}" for w in self.sets)]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {"eviction": [w.row(self.label) for w in self.sets]}

    def to_dict(self) -> dict[str, Any]:
        w = self.pays_from
        return {
            "deployment_id": self.deployment_id,
            "pays_from_conversations": w.conversations if w else None,
            "working_sets": [x.to_dict() for x in self.sets],
            "text": self.lines()[0],
        }


def _shares(turns: pd.DataFrame, point_ids: set[str]) -> dict[str, dict[str, float]]:
    t = turns[turns["point_id"].isin(point_ids) & (turns["turn"] >= 2)]
    out = {}
    for flow, g in t.groupby("flow"):
        means = {k: float(g[k].mean()) for k in SOURCES if k in g}
        total = sum(means.values())
        out[str(flow)] = {k: v / total if total else 0.0 for k, v in means.items()}
    return out


def _working_set_blocks(req: pd.DataFrame, point_ids: set[str], block: int) -> float:
    """Conversations x blocks of each one's longest prompt + output (mean over Points)."""
    r = req[req["point_id"].isin(point_ids)]
    if not len(r) or block <= 0:
        return math.nan
    longest = (
        (r["prompt_tokens"] + r["output_tokens"]).groupby([r["point_id"], r["conversation"]]).max()
    )
    per_point = np.ceil(longest / block).groupby(level=0).sum()
    return float(per_point.mean())


def answer(ctx: Context) -> list[EvictionAnswer]:
    data = ctx.data
    pts = data.points
    if not len(pts):
        return []
    cells = pc.cells(pts, ("pull", "recompute"))
    req = pc.request_metrics(data, ("ttft_ms", "prompt_tokens", "output_tokens"))
    saving = pc.per_repetition(req, "recompute", "pull", "ttft_ms")
    out = []
    for dep in sorted({d for d, _ in cells}):
        server = data.deployment_view(dep).server
        kinds = [k for d, k in cells if d == dep]
        mine = pts[(pts["deployment_id"] == dep) & (pts["status"] == "ok")]
        counts = mine.groupby("kind")["conversations"].first()
        if not server.prefill_prefix_caching or counts.nunique() < 2:
            continue  # the question needs P's own cache and a swept working set
        sets = []
        for kind in kinds:
            ids = set(mine[mine["kind"] == kind]["point_id"])
            sets.append(
                WorkingSet(
                    kind=kind,
                    conversations=int(counts[kind]),
                    blocks=_working_set_blocks(req, ids, server.block_size),
                    capacity=server.prefill_kv_blocks,
                    saving=pc.verdict(saving, dep, kind),
                    shares=_shares(data.turns, ids),
                )
            )
        sets.sort(key=lambda w: w.conversations)
        out.append(EvictionAnswer(dep, deployment_label(dep, pts), sets))
    return out


QUESTION = Question(
    name="eviction",
    title="From which working set does pulling evicted history back from D pay?",
    answer=answer,
    method=(
        "P keeps prefix caching with <code>server.prefill_kv_blocks</code> blocks; the number of "
        "conversations is swept past them. Per working set: each turn's prompt split into P's "
        "local hits, tokens pulled from D and tokens computed (server counters), and the TTFT "
        "pull recovers against recompute on the same conversations (turns >= 2), the mean of "
        "per-repetition paired differences with its 95% t interval. Pulling pays from the "
        "smallest working set whose recovered TTFT is decided above 0."
    ),
)
