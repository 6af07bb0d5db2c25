"""What a Point cost the decode instances: KV held over time, and D's own per-token latency.

With ``bidirectional_kv_xfer`` D keeps each finished request's blocks so that P can pull
them next turn; they are freed when P has read them, or when ``decoder_kv_blocks_ttl``
runs out (vLLM counts it in ``vllm:nixl_num_kv_expired_reqs``). Only turns of a flow that
pulls are kept: the router marks the others (a ``recompute`` turn has no pull to wait for)
and D frees their blocks at once (``connector.plugin.no_lease``), as a recompute deployment
without bidirectional transfer would.

Two views, both kept:

- measured: ``jobs.measure.kv_sampler``'s occupancy samples integrated over time (block-seconds
  above the level the Point started at), during the load and in the tail after it;
- by request, from the records: a request's blocks (``ceil((prompt + output) / block)``)
  held from its end until P's prefill of the conversation's next turn ended (``pull``), or
  for the TTL (no pull followed: the last turn, a ``recompute`` route of a pulling flow).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from jobs.measure import metrics
from jobs.measure.kv_sampler import EXPIRED
from pdbench.plan.deployments import KEEPS_D_KV
from records.point import DecodeBill, RequestRecord

# turns P prefilled and D decoded
D_PATHS = ("pull", "recompute", "recompute_expired", "recompute_diverged", "recompute_policy")
LEASING_FLOWS = tuple(f.value for f in KEEPS_D_KV)  # flows whose turns D keeps for a pull


def above_baseline_block_s(samples: list[list[float]], blocks: int, t_from: float = 0.0) -> float:
    """Trapezoid integral of (usage - first usage)+ x usable blocks from ``t_from`` on."""
    if len(samples) < 2 or blocks <= 1:
        return 0.0
    base = samples[0][1]
    total = 0.0
    for (t0, u0, *_), (t1, u1, *_) in zip(samples, samples[1:], strict=False):
        if t1 <= t_from:
            continue
        start = max(t0, t_from)
        total += (t1 - start) * (max(0.0, u0 - base) + max(0.0, u1 - base)) / 2
    return total * (blocks - 1)  # vLLM's usage leaves out its one null block


def tail_seconds(samples: list[list[float]], load_end_s: float) -> float:
    """Seconds from the load's end until usage was back at its first level with nothing
    running; -1 when the samples never got back there."""
    base = samples[0][1] if samples else 0.0
    for t_s, usage, running, *_ in samples:
        if t_s >= load_end_s and usage <= base + 1e-6 and running == 0:
            return max(0.0, t_s - load_end_s)
    return -1.0


def request_holds(
    records: Iterable[RequestRecord], block_size: int, ttl_s: float
) -> list[tuple[int, float, bool]]:
    """(blocks, seconds held, pulled) per request D decoded and kept, from the records."""
    ok = sorted(
        (r for r in records if r.status == "ok" and r.path in D_PATHS and r.flow in LEASING_FLOWS),
        key=lambda r: (r.conversation, r.turn),
    )
    by_turn = {(r.conversation, r.turn): r for r in ok}
    holds = []
    for r in ok:
        blocks = math.ceil((r.prompt_tokens + len(r.output_token_ids)) / max(1, block_size))
        end_s = r.start_s + r.e2e_ms / 1e3
        nxt = by_turn.get((r.conversation, r.turn + 1))
        if nxt is not None and nxt.path == "pull" and nxt.prefill_ms >= 0:
            pulled_at = nxt.start_s + nxt.prefill_ms / 1e3
            holds.append((blocks, min(ttl_s, max(0.0, pulled_at - end_s)), True))
        else:
            holds.append((blocks, ttl_s, False))
    return holds


def bill(
    records: list[RequestRecord],
    timeline: dict[str, list[list[float]]],
    blocks: dict[str, int],
    load_end_s: float,
    deltas: dict[str, dict[str, float]],
    decode_names: list[str],
    block_size: int,
    ttl_s: float,
    bidirectional: bool,
) -> DecodeBill:
    """The decode instances' bill for one Point (``decode_names``: D instances)."""
    names = [n for n in decode_names if timeline.get(n)]
    total_blocks = sum(blocks.get(n, 0) for n in decode_names)
    out = DecodeBill(blocks=total_blocks, ttl_s=ttl_s, load_s=load_end_s)
    if names and total_blocks:
        weight = {n: blocks.get(n, 0) / total_blocks for n in names}
        n_samples = min(len(timeline[n]) for n in names)
        during = [sum(weight[n] * timeline[n][i][1] for n in names) for i in range(n_samples)]
        times = [timeline[names[0]][i][0] for i in range(n_samples)]
        out.usage_peak = max(during, default=0.0)
        loaded = [u for u, t in zip(during, times, strict=True) if t <= load_end_s]
        out.usage_mean = sum(loaded) / len(loaded) if loaded else 0.0
        out.block_s = sum(above_baseline_block_s(timeline[n], blocks.get(n, 0)) for n in names)
        out.tail_block_s = sum(
            above_baseline_block_s(timeline[n], blocks.get(n, 0), load_end_s) for n in names
        )
        tails = [tail_seconds(timeline[n], load_end_s) for n in names]
        out.tail_s = -1.0 if min(tails) < 0 else max(tails)
        ends = [
            r.start_s + r.e2e_ms / 1e3 for r in records if r.status == "ok" and r.path in D_PATHS
        ]
        if ends:
            held = [tail_seconds(timeline[n], max(ends)) for n in names]
            out.release_s = -1.0 if min(held) < 0 else max(held)
    if bidirectional:
        for n_blocks, held_s, pulled in request_holds(records, block_size, ttl_s):
            if pulled:
                out.pulled_requests += 1
                out.pulled_block_s += n_blocks * held_s
            else:
                out.never_pulled_requests += 1
                out.never_pulled_block_s += n_blocks * held_s
    # leases run out after the load (the TTL's tail): the samples see them, the counters
    # scraped between waves do not
    out.expired_leases = sum(
        timeline[n][-1][3] - timeline[n][0][3]
        if len(timeline.get(n, [])) > 1
        else deltas.get(n, {}).get(EXPIRED, 0.0)
        for n in decode_names
    )
    out.itl_ms_server = 1e3 * (
        metrics.pooled_mean_s(deltas, decode_names, metrics.ITL_SECONDS) or 0
    )
    out.tpot_ms_server = 1e3 * (
        metrics.pooled_mean_s(deltas, decode_names, metrics.TPOT_SECONDS) or 0
    )
    return out
