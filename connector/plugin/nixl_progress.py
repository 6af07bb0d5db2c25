"""Give NIXL's UCX progress thread a poll timeout on vLLM-CPU, where its busy loop costs compute.

NIXL's Python agent (``nixl._api.nixl_agent``) creates its agent with ``pthrDelay = 0``: the
UCX backend's progress thread polls its sockets with a zero timeout, in a loop, for as long
as the agent lives. Every vLLM worker that uses the NIXL connector owns such an agent. On a
GPU node that loop costs one host core per worker, which the forward pass (on the GPU) does
not need. On a vLLM-CPU host it takes cores the forward passes run on: measured on a 2-core
host, an idle 1P1D deployment kept both cores busy (two threads at 80-100%, ~10,000 polls
a second each), so every prefill and decode shared its core with a thread that does nothing.

On CPU platforms the connector therefore builds its agent with a poll timeout of
``CPU_DELAY_US`` (the thread sleeps in ``poll`` until a socket is ready or the timeout ends);
``$PDBENCH_NIXL_PROGRESS_DELAY_US`` sets another value (0: NIXL's own busy loop), on GPUs
too. pdbench's launch spec sets that variable for every CPU P/D server, so the value is in
the spec (and the dry run) as well as the server log; the default here is for servers
started with the plugin by other means.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from connector.process_env import CPU_DELAY_US, NIXL_PROGRESS_DELAY_ENV, whole_number


def progress_delay_us(environ: Mapping[str, str], on_cpu: bool) -> int | None:
    """The progress thread's poll timeout in microseconds, or None for NIXL's own (0)."""
    delay = whole_number(
        environ,
        NIXL_PROGRESS_DELAY_ENV,
        "the NIXL progress thread's poll timeout in whole microseconds, 0 or more (0: NIXL's "
        "busy loop)",
    )
    if delay is not None:
        return delay
    return CPU_DELAY_US if on_cpu else None


def describe(delay_us: int | None) -> str:
    """One server-log line; tests read its ``NIXL progress thread`` part."""
    if delay_us is None:
        return "NIXL progress thread: NIXL's own busy loop (pthrDelay 0)"
    if delay_us == 0:
        return f"NIXL progress thread: busy loop (pthrDelay 0, {NIXL_PROGRESS_DELAY_ENV})"
    return f"NIXL progress thread polls with a {delay_us} us timeout (NIXL's own: 0, a busy loop)"


@contextmanager
def agent_progress_delay(agent_class: Any, delay_us: int | None) -> Iterator[bool]:
    """While open, every agent ``agent_class`` (NIXL's ``nixl_agent``) builds gets
    ``delay_us`` as its progress thread's poll timeout; yields whether it could be set.

    ``nixl_agent.__init__`` fills a bindings ``nixlAgentConfig`` (``pthrDelay = 0``) and
    passes it to the bindings' ``nixlAgent``; that constructor is wrapped for the duration
    so that the config it receives carries ``delay_us``."""
    bindings = getattr(
        sys.modules.get(getattr(agent_class, "__module__", ""), None), "nixlBind", None
    )
    original = getattr(bindings, "nixlAgent", None)
    if delay_us is None or original is None:
        yield False
        return

    def with_delay(name: str, config: Any, *args: Any, **kwargs: Any) -> Any:
        config.pthrDelay = delay_us
        return original(name, config, *args, **kwargs)

    bindings.nixlAgent = with_delay
    try:
        yield True
    finally:
        bindings.nixlAgent = original
