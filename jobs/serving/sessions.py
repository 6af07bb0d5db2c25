"""Conversations as the router knows them: who a request belongs to, what its D holds, and
whether the next prompt extends exactly that.

A request belongs to a conversation when it names one: the ``X-Session-ID`` header (what
vLLM's ``benchmarks/multi_turn`` client sends with ``--send-conversation-id``, beside a
``conversation_id`` body field), pdbench's ``X-Pdbench-Conversation``, AIPerf's
``X-Correlation-ID`` (its multi-turn mode's default), or that body field.
Without one, the router looks for the conversation whose tokens on D the prompt extends
(``Conversations.recognise``: a prefix match on token ids, as production routers recognise
reuse; ``flow.match_prefix``), so a client that resends its history (GuideLLM's multi-turn
mode, any chat client) gets pulls with no header; a prompt that extends none starts a
conversation of its own, named ``prefix-<id>`` (unless it extends the prompt of a turn still
in flight: it waits for that turn's end, then is matched). With ``flow.match_prefix=false`` such a
request stands alone: no state is kept, nothing is pulled for it.

What D holds after a turn is the KV of the first ``remote_num_tokens`` tokens of that turn's
prompt followed by its output (vLLM's params; the output ids come from D's plugin). P may
pull them only for a prompt that begins with exactly those tokens: a chat client that
strips part of a reply or edits an earlier message sends a prompt whose first tokens are no
longer what D computed, and P would read KV of other tokens (wrong outputs, silently).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.serving.router_headers import CONVERSATION_HEADER

SESSION_HEADER = "X-Session-ID"  # vLLM's benchmarks/multi_turn client, --send-conversation-id
SESSION_BODY_KEY = "conversation_id"  # the same client's body field (vLLM's multi-turn proxy)
CORRELATION_HEADER = "X-Correlation-ID"  # AIPerf's multi-turn mode: one id per conversation
PRUNE_EVERY = 256  # requests between sweeps of idle conversations
PREFIX_KEY_TOKENS = 16  # the held tokens' start that indexes a conversation for recognition
RECOGNISED = "prefix-"  # how the router names a conversation it found by its tokens


def session_of(headers: Mapping[str, str], body: dict[str, Any]) -> str:
    """The conversation a request names ("" when none: it stands alone)."""
    for name in (CONVERSATION_HEADER, SESSION_HEADER, CORRELATION_HEADER):
        value = headers.get(name, "")
        if value:
            return value
    value = body.get(SESSION_BODY_KEY)
    return str(value) if value not in (None, "") else ""


@dataclass
class ConversationState:
    """What the router knows of one conversation's KV on its D instance."""

    d_params: dict[str, Any] | None = None
    d_params_at: float = 0.0  # router monotonic time when D finished the last turn
    # The tokens whose KV D holds (the last prompt and its output, ``remote_num_tokens``
    # long): the next prompt must begin with exactly these for P to pull them.
    held: list[int] = field(default_factory=list)
    turns: int = 0
    last_used: float = 0.0  # router monotonic time of the last request
    # Set once the last turn's params are in (or known missing); the next turn waits for it.
    settled: asyncio.Event | None = None
    asking: list[int] = field(default_factory=list)  # the prompt of the turn in flight

    @property
    def d_tokens(self) -> int:
        return len(self.held)

    def forget_d(self) -> None:
        self.d_params, self.held = None, []


def diverges_at(prompt: list[int], held: list[int]) -> int | None:
    """None when ``prompt`` extends ``held`` (begins with every held token and has at least
    one more: P computes the rest); else the first position where they part (``len(prompt)``
    when the prompt ends within ``held``)."""
    n = len(held)
    if len(prompt) > n and prompt[:n] == held:
        return None
    for i, (a, b) in enumerate(zip(prompt, held, strict=False)):
        if a != b:
            return i
    return min(len(prompt), n)


def held_tokens(prompt: list[int], output_ids: list[int], remote_num_tokens: int) -> list[int]:
    """The tokens D holds the KV of after a turn: its prompt and output, as far as
    ``remote_num_tokens`` (vLLM's count of the tokens D computed: the last output token has
    no KV yet)."""
    n = max(0, remote_num_tokens)
    if n <= len(prompt):
        return list(prompt[:n])
    return list(prompt) + list(output_ids[: n - len(prompt)])


class Conversations:
    """The router's conversations by id. Idle ones are dropped (a sweep every
    ``PRUNE_EVERY`` requests) once D's lease on their KV is long gone, so that a serving
    router driven by an external client for hours does not grow without bound."""

    def __init__(self, idle_s: float):
        self.idle_s = idle_s
        self._states: dict[str, ConversationState] = {}
        self._since_prune = 0
        # the first PREFIX_KEY_TOKENS held tokens -> the conversations holding them
        self._by_start: dict[tuple[int, ...], set[str]] = {}
        self._start_of: dict[str, tuple[int, ...]] = {}

    def index(self, session: str, state: ConversationState) -> None:
        """Make ``session`` findable by its held tokens (after D's params of a turn came)."""
        if self._states.get(session) is not state:
            return
        self._unindex(session)
        if len(state.held) >= PREFIX_KEY_TOKENS:
            start = tuple(state.held[:PREFIX_KEY_TOKENS])
            self._by_start.setdefault(start, set()).add(session)
            self._start_of[session] = start

    def _unindex(self, session: str) -> None:
        start = self._start_of.pop(session, None)
        holders = self._by_start.get(start) if start is not None else None
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._by_start[start]

    def recognise(self, prompt: list[int]) -> str:
        """The conversation whose held tokens ``prompt`` extends, the longest if several
        (``""``: none; a conversation with a turn still in flight is not a candidate)."""
        if len(prompt) <= PREFIX_KEY_TOKENS:
            return ""
        best, best_len = "", 0
        for session in self._by_start.get(tuple(prompt[:PREFIX_KEY_TOKENS]), ()):
            state = self._states.get(session)
            if state is None or state.settled is not None or state.d_params is None:
                continue
            if len(state.held) > best_len and diverges_at(prompt, state.held) is None:
                best, best_len = session, len(state.held)
        return best

    def in_flight_before(self, prompt: list[int]) -> asyncio.Event | None:
        """When ``prompt`` extends the prompt of a turn still in flight (the longest if
        several), that turn's ``settled`` event: a client that sends its next turn the moment
        the last answer ended comes before the router knows what D holds, and waits for it
        instead of starting a conversation of its own. None when no turn in flight fits."""
        best, best_len = None, 0
        for state in self._states.values():
            asking = state.asking
            if state.settled is None or not best_len < len(asking) < len(prompt):
                continue
            if prompt[: len(asking)] == asking:
                best, best_len = state.settled, len(asking)
        return best

    def get(self, session: str, now: float) -> ConversationState:
        """The state of ``session``; a fresh one kept nowhere when ``session`` is ""."""
        self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:
            self.prune(now)
        if not session:
            return ConversationState(last_used=now)
        state = self._states.setdefault(session, ConversationState())
        state.last_used = now
        return state

    def prune(self, now: float) -> int:
        """Drop conversations idle for ``idle_s`` with no turn in flight; returns how many."""
        self._since_prune = 0
        stale = [
            k
            for k, s in self._states.items()
            if s.settled is None and now - s.last_used > self.idle_s
        ]
        for k in stale:
            del self._states[k]
            self._unindex(k)
        return len(stale)

    def clear(self) -> None:
        self._states.clear()
        self._by_start.clear()
        self._start_of.clear()

    def __len__(self) -> int:
        return len(self._states)
