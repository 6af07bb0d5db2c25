"""How long P may pull a conversation's history from D after D served its last turn (pure).

With bidirectional pull D keeps each finished turn's KV blocks for
``flow.decoder_kv_blocks_ttl_s``. vLLM 0.32's P declines to read blocks within
``VLLM_DECLINE_MARGIN_S`` of their expiry (``nixl/pull_worker.py``:
``_KV_BLOCKS_EXPIRY_SAFETY_MARGIN``, "Declining expired remote read"), and a request P
declines stalls; so the router hands P D's blocks only while the lease outlasts that margin
plus P's queueing (``min(5 s, TTL / 5)``). The router (``jobs/serving/router.py``) routes by
this window; validation (``pdbench.validate.premises``) refuses a TTL whose window is empty:
P would never pull.
"""

from __future__ import annotations

VLLM_DECLINE_MARGIN_S = 5.0
QUEUE_ALLOWANCE_MAX_S = 5.0
QUEUE_ALLOWANCE_SHARE = 0.2  # of the TTL


def pull_window_s(ttl_s: float) -> float:
    """Seconds after D answered a turn during which the router lets P pull it (<= 0: never)."""
    allowance = min(QUEUE_ALLOWANCE_MAX_S, QUEUE_ALLOWANCE_SHARE * ttl_s)
    return ttl_s - VLLM_DECLINE_MARGIN_S - allowance


def shortest_pulling_ttl_s(window_s: float = 0.0) -> int:
    """The shortest whole-second TTL whose pull window is longer than ``window_s``."""
    ttl = 1
    while pull_window_s(ttl) <= window_s:
        ttl += 1
    return ttl
