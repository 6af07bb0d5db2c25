"""On vLLM-CPU, an engine that only holds KV blocks for a peer waits for work instead of
stepping 1,000 times a second.

A request that finished with its KV blocks kept for a peer (D's lease under the
bidirectional pull, ``decoder_kv_blocks_ttl``; P's blocks until D reads them) stays in
vLLM's scheduler until the peer's read or the lease's expiry frees them, and vLLM's engine
core steps while any such request exists: an empty schedule, an empty forward, an output
to the API server, then ``time.sleep(0.001)``. On a GPU node that loop costs one host core.
On a vLLM-CPU host it costs the cores the forward passes run on: measured on a 2-core host,
an idle 1P1D deployment's D took ~60% of a core (engine 37-39%, its API server 20-21%)
for the whole 60 s TTL after its last request, and a run with pull always holds a lease.

On CPU platforms the plugin therefore makes such an engine wait on its input queue for up
to ``CPU_WAIT_MS`` between those steps (``PDBENCH_ENGINE_IDLE_WAIT_MS`` sets another
value, 0: vLLM's own loop; on GPUs too). Only when the scheduler has no unfinished request:
a request waiting for KV from a peer, prefilling or decoding keeps vLLM's loop, and a new
request ends the wait at once, so no TTFT moves; a peer's read or an expiry is seen up to
that much later (blocks freed up to that much later, against a lease of seconds).
pdbench's launch spec sets the variable for every CPU P/D server, so the value is in the
spec, the dry run and the server log. Measured on the same host and deployment, D idle
with leases held: ~60% of a core with vLLM's loop, 16% waiting up to 10 ms, 6% up to 50 ms
(this default); 3% once the leases had expired, with either (one 10 s ``top`` sample each).
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from typing import Any

from connector.process_env import CPU_WAIT_MS, ENGINE_IDLE_WAIT_ENV, whole_number

_PATCHED = "_pdbench_idle_wait_s"  # set on the engine class once patched: the wait in seconds


def idle_wait_ms(environ: Mapping[str, str], on_cpu: bool) -> int | None:
    """The longest wait between steps of an engine holding only leases, in ms; None: vLLM's
    own loop (GPU platforms unless the variable says otherwise)."""
    wait = whole_number(
        environ,
        ENGINE_IDLE_WAIT_ENV,
        "the engine's wait between steps that only hold KV blocks for a peer in whole "
        "milliseconds, 0 or more (0: vLLM's 1 ms loop)",
    )
    if wait is not None:
        return wait
    return CPU_WAIT_MS if on_cpu else None


def describe(wait_ms: int | None) -> str:
    """One server-log line; tests read its ``engine idle`` part."""
    if not wait_ms:
        return "engine idle: vLLM's own loop while only leases are held (a step every 1 ms)"
    return (
        f"engine idle: waits up to {wait_ms} ms for a request between steps while it only "
        "holds KV blocks for a peer (vLLM's own: a step every 1 ms)"
    )


def only_leases(scheduler: Any) -> bool:
    """No request to run or to wait for KV for, only finished ones whose blocks a peer may
    still read (vLLM keeps stepping for those)."""
    return not scheduler.has_unfinished_requests() and scheduler.has_finished_requests()


def install(engine_class: Any, wait_ms: int | None) -> bool:
    """Patch ``engine_class`` (vLLM's ``EngineCoreProc``, the engine-core process) so that
    after an empty step that leaves only leases it waits up to ``wait_ms`` for its next
    request (handled at once when one comes). Returns whether it is in place; idempotent
    (the first wait holds)."""
    if not wait_ms:
        return False
    if getattr(engine_class, _PATCHED, None) is not None:
        return True
    step = getattr(engine_class, "_process_engine_step", None)
    if step is None or not hasattr(engine_class, "_handle_client_request"):
        return False  # another vLLM: leave its loop alone
    wait_s = wait_ms / 1000.0

    def _process_engine_step(self: Any) -> bool:
        executed = step(self)
        if not executed and only_leases(self.scheduler):
            try:
                request = self.input_queue.get(timeout=wait_s)
            except queue.Empty:
                return executed
            self._handle_client_request(*request)
        return executed

    engine_class._process_engine_step = _process_engine_step
    setattr(engine_class, _PATCHED, wait_s)
    return True
