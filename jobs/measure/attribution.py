"""Turn server-side counter deltas and request records into a PointResult's numbers.

Server counters, not client guesses, say where each turn's prompt tokens came from: computed
on P (or on the instance that served alone), hit in a local prefix cache, or pulled from the
other side. NIXL bytes are counted by the reader, so P's bytes are what P pulled from D and
D's bytes are the usual P -> D hand-off.
"""

from __future__ import annotations

import statistics

from jobs.measure import metrics as m
from records.point import LatencyStats, RequestRecord, Summary, TransferTotals, TurnRow


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; 0.0 for no values."""
    if not values:
        return 0.0
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def latency_stats(values: list[float]) -> LatencyStats:
    if not values:
        return LatencyStats()
    return LatencyStats(
        p50=percentile(values, 50),
        p90=percentile(values, 90),
        p99=percentile(values, 99),
        mean=statistics.fmean(values),
    )


def summarize(records: list[RequestRecord], duration_s: float) -> Summary:
    """Latency statistics of the ok requests: ITL over the gaps between chunks, TPOT over the
    requests of two tokens or more (as ``vllm bench serve`` counts them)."""
    ok = [r for r in records if r.status == "ok"]
    output_tokens = sum(len(r.output_token_ids) for r in ok)
    chunks = sum(len(r.chunk_tokens) for r in ok)
    return Summary(
        ttft_ms=latency_stats([r.ttft_ms for r in ok]),
        itl_ms=latency_stats([x for r in ok for x in r.itl_ms]),
        e2e_ms=latency_stats([r.e2e_ms for r in ok]),
        requests=len(records),
        failed_requests=len(records) - len(ok),
        output_tokens=output_tokens,
        duration_s=duration_s,
        throughput_tok_s=output_tokens / duration_s if duration_s > 0 else 0.0,
        tpot_ms=latency_stats([r.tpot_ms for r in ok if len(r.output_token_ids) > 1]),
        tokens_per_chunk_mean=sum(sum(r.chunk_tokens) for r in ok) / chunks if chunks else 0.0,
    )


def _sum(deltas: dict[str, dict[str, float]], names: list[str], fn) -> float:
    return sum(fn(deltas[n]) for n in names if n in deltas)


def turn_row(
    turn: int,
    records: list[RequestRecord],
    deltas: dict[str, dict[str, float]],
    prefill_names: list[str],
    serving_names: list[str],
) -> TurnRow:
    """One turn's row. ``serving_names``: instances that computed prompts in this flow."""
    ok = [r for r in records if r.status == "ok"]
    paths: dict[str, int] = {}
    for r in records:
        paths[r.path or "?"] = paths.get(r.path or "?", 0) + 1
    n = max(1, len(ok))
    prefill_ms = [r.prefill_ms for r in ok if r.prefill_ms >= 0]

    def by_source(source: str):
        return lambda d: m.tokens_by_source(d, source)

    return TurnRow(
        turn=turn,
        requests=len(records),
        history_tokens_mean=sum(r.history_tokens for r in ok) / n,
        prompt_tokens_mean=sum(r.prompt_tokens for r in ok) / n,
        ttft_ms_p50=percentile([r.ttft_ms for r in ok], 50),
        ttft_ms_mean=sum(r.ttft_ms for r in ok) / n,
        prefill_tokens_computed=_sum(deltas, serving_names, by_source("local_compute")) / n,
        prefix_hit_tokens=_sum(deltas, serving_names, by_source("local_cache_hit")) / n,
        tokens_pulled=_sum(deltas, prefill_names, by_source("external_kv_transfer")) / n,
        bytes_pulled=_sum(deltas, prefill_names, m.nixl_bytes),
        paths=paths,
        prefill_ms_p50=percentile(prefill_ms, 50) if prefill_ms else -1.0,
        nixl=nixl_by_instance(deltas),
    )


def nixl_by_instance(deltas: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """NIXL bytes, seconds and transfer count each instance read (those that read any)."""
    out = {}
    for name, d in deltas.items():
        if m.nixl_count(d) or m.nixl_bytes(d):
            out[name] = {
                "bytes": m.nixl_bytes(d),
                "seconds": m.nixl_seconds(d),
                "count": m.nixl_count(d),
            }
    return out


def add_split(row: TurnRow, records: list[RequestRecord]) -> None:
    """The turn's mean TTFT parts over its split requests, and where they came from."""
    split = [r for r in records if r.status == "ok" and r.ttft_split]
    row.split_sources = {}
    for r in split:
        row.split_sources[r.split_source] = row.split_sources.get(r.split_source, 0) + 1
    if split:
        keys = list(split[0].ttft_split)
        row.ttft_split_mean = {k: statistics.fmean(r.ttft_split[k] for r in split) for k in keys}


def transfer_totals(deltas: dict[str, dict[str, float]]) -> TransferTotals:
    names = list(deltas)
    return TransferTotals(
        bytes=_sum(deltas, names, m.nixl_bytes),
        seconds=_sum(deltas, names, m.nixl_seconds),
        count=_sum(deltas, names, m.nixl_count),
        failed=_sum(deltas, names, m.nixl_failed),
        read_after_expiry=_sum(deltas, names, m.nixl_reads_after_expiry),
    )


def add_deltas(total: dict[str, dict[str, float]], part: dict[str, dict[str, float]]) -> None:
    for name, d in part.items():
        acc = total.setdefault(name, {})
        for k, v in d.items():
            acc[k] = v if k in m.GAUGES else acc.get(k, 0.0) + v
