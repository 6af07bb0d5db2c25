"""D keeps no blocks for a turn nobody can continue.

With ``bidirectional_kv_xfer`` vLLM's NIXL scheduler keeps every finished request's blocks on
D for ``decoder_kv_blocks_ttl``, so that P can pull them next turn. The router knows which
turns can have a next one (a conversation it remembers, in a flow that pulls); for every
other turn (a request naming no conversation with prefix matching off, any turn of the
``recompute`` flow) it puts ``NO_LEASE_KEY`` in D's ``kv_transfer_params``, and the plugin
hands the blocks back at once, as vLLM does for an aborted request: the lease is taken off
the scheduler's send list before the worker is told of it, and the request leaves the
worker's to-process set. Single-turn load then leaves D's cache as it found it instead of
holding dead leases for the TTL.
"""

from __future__ import annotations

import logging
from typing import Any

NO_LEASE_KEY = "pdbench_no_lease"  # in D's kv_transfer_params: free the blocks at once

logger = logging.getLogger("vllm.pdbench.no_lease")
_warned: list[bool] = []  # whether the scheduler's shape was found unknown (said once)


def wants_no_lease(params: dict[str, Any] | None) -> bool:
    """Whether a request's ``kv_transfer_params`` ask D to keep nothing."""
    return bool(params and params.get(NO_LEASE_KEY))


def release(scheduler: Any, request_id: str) -> bool:
    """Take ``request_id``'s lease off vLLM's NIXL scheduler (its ``_reqs_need_send`` deadline,
    and the worker told to stop tracking it). False when this vLLM's scheduler has not the
    shape read here (vLLM 0.32 and 0.33): the blocks are then kept for the TTL as before."""
    need_send = getattr(scheduler, "_reqs_need_send", None)
    not_processed = getattr(scheduler, "_reqs_not_processed", None)
    if not isinstance(need_send, dict) or not isinstance(not_processed, set):
        if not _warned:  # once: the same for every request after
            _warned.append(True)
            logger.warning("pdbench: this vLLM's NIXL scheduler keeps leases its own way: kept")
        return False
    need_send.pop(request_id, None)
    not_processed.add(request_id)
    return True
