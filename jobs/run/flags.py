"""What a Point's logs and counters say went wrong, as the record's flags (pure).

Each function takes what was read (a stretch of the servers' logs, the transports UCX
printed, the NIXL counters, the router's stats) and returns flag lines, one per problem;
``jobs.run.point`` reads the logs and joins the lines into ``PointResult.flags``.
"""

from __future__ import annotations

from connector.ucx import expand, unexpected_path
from connector.ucx_proto import tcp_fallback
from jobs.serving.server_log import expired_unread_leases, failed_loads, recomputed_loads
from pdbench.config.schema import TransportConfig
from pdbench.spec.launch import InstanceSpec
from records.point import OfferedLoadView, TransferTotals

# What vLLM did with a failed KV load under each server.kv_load_failure_policy.
AFTER_FAILED_LOAD = {"recompute": "recomputed their blocks", "fail": "failed their requests"}


def transport_flags(
    instances: list[InstanceSpec],
    used: dict[str, dict[str, list[str]]],
    transport: TransportConfig,
) -> list[str]:
    """Per P/D instance, from the transports UCX says carried KV (``used[name]``:
    ``{"read": [...], "write": [...]}``): a TCP fallback, or a path other than those the
    transport config expects."""
    expected = list(transport.expected_ucx_transports)
    flags = []
    for inst in instances:
        if inst.name not in used:
            continue
        reads, writes = used[inst.name]["read"], used[inst.name]["write"]
        tls = inst.env.get("UCX_TLS", "")  # what the server ran with (its launch spec)
        if tcp_fallback(reads, tls):
            flags.append(
                f"{inst.name}: KV reads went over {reads}: TCP, though UCX_TLS="
                f"{tls or '(unset)'} does not name it; UCX found no faster path (check "
                "UCX_TLS, GPUDirect RDMA, cuda_ipc)"
            )
        moved = sorted(set(reads) | set(writes))
        if unexpected_path(moved, expected):
            flags.append(
                f"{inst.name}: KV moved over {moved}, none of the transports "
                f"{transport.name} expects ({', '.join(sorted(expand(expected)))}; "
                "transport.expected_ucx_transports): its bandwidth is not that link's "
                "(check UCX_TLS, the NICs and GPUDirect RDMA, or the transport config)"
            )
    return flags


def lease_flags(prefill_stretches: list[str], point_id: str) -> list[str]:
    """P requests of this Point whose KV lease ran out before D read it (the Point's
    stretch of each prefill instance's log)."""
    stalled = sum(expired_unread_leases(text, point_id) for text in prefill_stretches)
    if not stalled:
        return []
    return [
        f"{stalled} prefill request(s) of this point had their KV lease expire before D "
        "read it (vLLM: 'Releasing expired KV blocks ... retrieved by 0'): D stalled, "
        "and their TTFT measures the stall, not the transfer"
    ]


def transfer_flags(t: TransferTotals, policy: str, transport: TransportConfig) -> list[str]:
    """From the Point's NIXL counters: failed transfers, reads after a lease expired, and a
    link far slower than ``transport.expected_gb_s``."""
    flags = []
    if t.failed:
        flags.append(
            f"{t.failed:g} KV transfer(s) failed (vllm:nixl_num_failed_transfers); vLLM "
            f"{AFTER_FAILED_LOAD[policy]} (server.kv_load_failure_policy={policy})"
        )
    if t.read_after_expiry:
        flags.append(
            f"{t.read_after_expiry:g} KV read(s) arrived after the owner's lease had expired "
            "(vllm:nixl_num_notifications_after_expiry): those requests may have used KV "
            "that was no longer theirs; check their outputs against agg"
        )
    expected = float(transport.expected_gb_s)
    if expected > 0 and t.seconds > 0 and t.bytes / t.seconds / 1e9 < 0.1 * expected:
        flags.append(
            f"KV moved at {t.bytes / t.seconds / 1e9:.2f} GB/s, under 10% of the "
            f"{expected:g} GB/s transport.expected_gb_s for {transport.name}"
        )
    return flags


def kv_load_flags(log_text: str) -> list[str]:
    """Requests of this Point whose KV did not load (its stretch of the P/D logs):
    recomputed (``kv_load_failure_policy=recompute``: always a flag, their TTFT is a
    recompute, not a transfer) or failed."""
    flags = []
    recomputed = recomputed_loads(log_text)
    if recomputed:
        flags.append(
            f"{recomputed} request(s) recomputed KV that failed to load (vLLM: 'Recovered "
            "from KV load failure', kv_load_failure_policy=recompute): their TTFT measures "
            "a recompute, not a transfer"
        )
    failed = failed_loads(log_text)
    if failed:
        flags.append(
            f"{failed} request(s) failed because their KV did not load (vLLM: 'Failing ... "
            "due to KV load failure', kv_load_failure_policy=fail)"
        )
    return flags


def handoff_flags(router_stats: dict) -> list[str]:
    """Pull / decode-first turns whose D params never reached the router (from D's
    plugin, ``connector.plugin.kv_params_service``): their next turn recomputed the history
    instead of pulling it."""
    missing = int(router_stats.get("missing_params", 0) or 0)
    if not missing:
        return []
    return [
        f"{missing} turn(s) got no KV params from D after they finished (router "
        "missing_params): the conversation's next turn recomputed its history instead "
        "of pulling it (check D's log for the pdbench KV-params service)"
    ]


def expired_lease_flags(router_stats: dict, ttl_s: int) -> list[str]:
    """Pull / decode-first turns the router recomputed because D's lease on their history
    had run out (route ``recompute_expired``): the Point's "pull" is partly a recompute."""
    expired = int(router_stats.get("expired_leases", 0) or 0)
    if not expired:
        return []
    return [
        f"{expired} turn(s) were recomputed, not pulled: D's lease on their history "
        f"(flow.decoder_kv_blocks_ttl_s={ttl_s}) left P no time to pull when they came "
        "(router recompute_expired); this Point's pull TTFT mixes in recomputes (raise the "
        "TTL past the time between a conversation's turns at this load)"
    ]


def open_loop_flags(offered_load: OfferedLoadView) -> list[str]:
    """An open loop the deployment did not keep up with: its latencies are a queue's."""
    if offered_load.kept_up is None or offered_load.kept_up:
        return []
    return [
        f"open loop: {offered_load.late_share:.0%} of turns went out late (p90 "
        f"{offered_load.lateness_p90_ms:,.0f} ms behind their slot): the deployment did not "
        f"keep up with {offered_load.offered_rate:g} turns/s (achieved "
        f"{offered_load.achieved_rate:.2f}/s); its latencies are those of a growing queue "
        "(lower workload.request_rate)"
    ]
