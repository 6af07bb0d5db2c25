"""Scrape vLLM's Prometheus endpoint and keep the deltas pdbench attributes turns with.

Counters kept (summed over label sets other than ``source``):
``vllm:prompt_tokens_by_source`` split into ``local_compute``, ``local_cache_hit`` and
``external_kv_transfer``; prompt and generation tokens; local and external prefix-cache
queries and hits; every ``vllm:nixl_*`` series (histogram ``_sum``/``_count`` and counters);
the server's own ITL and TPOT histograms (``_sum``/``_count``: what the decode node itself
measured per output token, beside the client's chunk gaps).
"""

from __future__ import annotations

import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_SOURCE = re.compile(r'source="([^"]+)"')

KEPT_PREFIXES = (
    "vllm:nixl_",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:prefix_cache_",
    "vllm:external_prefix_cache_",
    "vllm:request_success",
    "vllm:num_preemptions",
    # per-request histograms (sum, count): the TTFT split's per-wave means (ttft_split.py)
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    # D's own ITL/TPOT histograms: the decode node's bill (decode_bill.py)
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
)

ITL_SECONDS = "vllm:inter_token_latency_seconds"
TPOT_SECONDS = "vllm:request_time_per_output_token_seconds"

# The gauges kept as they are (not as deltas).
GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running")


def parse_prometheus(text: str) -> dict[str, float]:
    """Sum samples by metric name (and by ``source`` label where present)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        if not (name.startswith(KEPT_PREFIXES) or name in GAUGES):
            continue
        if name.endswith("_bucket") or name.endswith("_created"):
            continue
        source = _SOURCE.search(labels)
        key = f"{name}[{source.group(1)}]" if source else name
        try:
            out[key] = out.get(key, 0.0) + float(value)
        except ValueError:
            continue
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counter differences; gauges keep their ``after`` value."""
    keys = set(before) | set(after)
    return {
        k: after.get(k, 0.0) if k in GAUGES else after.get(k, 0.0) - before.get(k, 0.0)
        for k in sorted(keys)
    }


async def scrape_async(session, base_url: str) -> dict[str, float]:
    async with session.get(f"{base_url}/metrics") as resp:
        return parse_prometheus(await resp.text())


def nixl_bytes(d: dict[str, float]) -> float:
    return d.get("vllm:nixl_bytes_transferred_sum", 0.0)


def nixl_seconds(d: dict[str, float]) -> float:
    return d.get("vllm:nixl_xfer_time_seconds_sum", 0.0)


def nixl_count(d: dict[str, float]) -> float:
    return d.get("vllm:nixl_xfer_time_seconds_count", 0.0)


def nixl_failed(d: dict[str, float]) -> float:
    """Transfers NIXL reported failed (with ``kv_load_failure_policy=recompute`` vLLM then
    recomputed the blocks they should have brought)."""
    return d.get("vllm:nixl_num_failed_transfers_total", 0.0)


def nixl_reads_after_expiry(d: dict[str, float]) -> float:
    """Peer reads of blocks this instance had already released (lease expired): the reader
    may have received KV that no longer belonged to its request."""
    return d.get("vllm:nixl_num_notifications_after_expiry_total", 0.0)


def tokens_by_source(d: dict[str, float], source: str) -> float:
    return d.get(f"vllm:prompt_tokens_by_source_total[{source}]", 0.0)


def pooled_total(deltas: dict[str, dict[str, float]], names: list[str], key: str) -> float:
    """``key`` summed over the deltas of the instances ``names``."""
    return sum(deltas.get(n, {}).get(key, 0.0) for n in names)


def pooled_mean_s(deltas: dict[str, dict[str, float]], names: list[str], name: str) -> float | None:
    """The mean of a seconds histogram pooled over instances ``names`` (sums over counts);
    None when none of them counted anything."""
    count = pooled_total(deltas, names, f"{name}_count")
    return pooled_total(deltas, names, f"{name}_sum") / count if count else None


def histogram_mean_ms(d: dict[str, float], name: str) -> float:
    """The mean of a seconds histogram over a delta (``_sum`` / ``_count``), in ms; 0 if empty."""
    count = d.get(f"{name}_count", 0.0)
    return 1e3 * d.get(f"{name}_sum", 0.0) / count if count > 0 else 0.0
