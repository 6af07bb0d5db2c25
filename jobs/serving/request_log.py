"""The router's own record of every request it served, one JSON line each.

So that a run driven by any client (``python -m pdbench serve`` and an external load
generator) can still be attributed, and replayed (``workload=trace`` with
``workload.trace.format=pdbench``: ``pdbench.traffic.recorded``): per request, the
conversation, when it arrived, the route taken, the prompt's and the answer's tokens and
how many of them D held and P was offered, how many P did not compute (its own prefix
cache plus what it pulled, from P's usage), where a prompt parted from D's tokens, and the
router's spans (route, P, gap, D to its first chunk, to its last).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class TurnLog:
    """One request as the router served it (``request_log`` lines)."""

    request_id: str
    session: str  # the conversation ("prefix-<id>": one the router named; "": none)
    api: str  # chat | completions
    flow: str
    path: str = ""  # the route taken (pull, recompute, recompute_diverged, agg, ...)
    turn: int = 0  # the conversation's turn as the router counted it (1-based; 0: alone)
    prompt_tokens: int = 0
    # tokens of the answer (its usage, else its streamed chunks); 0 unless answered 200
    output_tokens: int = 0
    held_tokens: int = 0  # tokens of the prompt D held the KV of (0: none, or diverged)
    offered_tokens: int = 0  # of those, handed to P to pull (or served by D alone)
    diverged_at: int = -1  # where the prompt parted from D's tokens (-1: it did not)
    p_cached_tokens: int = -1  # P's prompt tokens not computed (prefix cache + pulled); -1: no P
    status: int = 0  # HTTP status answered
    error: str = ""
    at: float = field(default_factory=time.time)  # unix time the request arrived
    spans_ms: dict[str, float] = field(default_factory=dict)  # route, p, gap, d, last
    client_request_id: str = ""  # the client's X-Request-ID ("" when it sent none)
    # how the turn was found to belong to its conversation: "header" (one named it),
    # "prefix" (its prompt extends the tokens D holds of one), "" (neither: a new one)
    matched: str = ""
    load_in_flight: int = 0  # turns in flight at this turn's P, this one included (0: no P)
    # flow policy, on a turn that could pull: the rule's decision and its inputs
    # (pdbench.results.policy_rule.PullDecision.record); {} otherwise
    decision: dict = field(default_factory=dict)

    @property
    def p_computed_tokens(self) -> int:
        """Prompt tokens P computed itself (-1 without P)."""
        return self.prompt_tokens - self.p_cached_tokens if self.p_cached_tokens >= 0 else -1


class RequestLog:
    """Appends ``TurnLog`` lines to ``path`` (line-buffered: a crash keeps what was served);
    a ``path`` of "" keeps nothing."""

    def __init__(self, path: str):
        self._file: IO[str] | None = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the router's life

    def write(self, entry: TurnLog) -> None:
        if self._file is not None:
            line = asdict(entry)
            line["p_computed_tokens"] = entry.p_computed_tokens
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_log(path: str | Path) -> list[dict]:
    """A request log's lines (a torn last line, from a crash, is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
