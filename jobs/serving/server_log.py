"""What a Point's stretch of a vLLM server log says about its KV loads (pure parsers, and
the offsets that cut one Point's stretch out of a log every Point of a Deployment shares).

vLLM 0.32's scheduler says when it fell back to recomputing KV that failed to load
(``kv_load_failure_policy=recompute``) and when it failed requests instead (``fail``)::

    Recovered from KV load failure: 2 request(s) rescheduled (64 tokens affected).
    Failing 1 request(s) due to KV load failure (failure_policy=fail, 32 tokens affected). ...

Both cover failures NIXL's ``vllm:nixl_num_failed_transfers`` does not count (a failed
handshake with the peer, for instance).
"""

from __future__ import annotations

import re
from pathlib import Path


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log ("" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_RECOVERED = re.compile(r"Recovered from KV load failure: (\d+) request\(s\) rescheduled")
_FAILING = re.compile(r"Failing (\d+) request\(s\) due to KV load failure")


def recomputed_loads(text: str) -> int:
    """Requests whose KV failed to load and that vLLM recomputed instead."""
    return sum(int(n) for n in _RECOVERED.findall(text))


def failed_loads(text: str) -> int:
    """Requests vLLM failed because their KV did not load (``kv_load_failure_policy=fail``)."""
    return sum(int(n) for n in _FAILING.findall(text))


def expired_unread_leases(text: str, tag: str) -> int:
    """P requests tagged ``tag`` (a Point id, in the router's request ids) whose blocks the
    peer never read before P's lease ran out (vLLM: "Releasing expired KV blocks for request
    ... retrieved by 0 remote worker(s)")."""
    needle = "Releasing expired KV blocks for request"
    return sum(
        1
        for line in text.splitlines()
        if needle in line and tag in line and "retrieved by 0" in line
    )


class LogWindow:
    """The part of some log files written between ``LogWindow(paths)`` and ``read()``."""

    def __init__(self, paths: list[str]):
        self.offsets = {path: _size(path) for path in paths}

    def read(self) -> dict[str, str]:
        out = {}
        for path, offset in self.offsets.items():
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    out[path] = f.read().decode(errors="replace")
            except OSError:
                out[path] = ""
        return out


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
