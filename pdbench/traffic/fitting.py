"""A trace cut and scaled to the machine: a time window, a number of requests, conversations
of enough turns, lengths scaled down, time sped up. The conversations keep their shape: the
same turns in the same order, each length scaled alike (at least 1 token)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pdbench.traffic.trace import Trace, TraceConversation, TraceTurn, context_needed

SCALE_DIGITS = 4  # the largest scale that fits is given to this many significant digits


@dataclass(frozen=True)
class TraceCut:
    """Which requests of a trace to replay (times on the trace's own clock)."""

    start_s: float = 0.0
    end_s: float = 0.0  # 0: to the end
    max_requests: int = 0  # 0: all; else the first this many (by time)
    min_turns: int = 1  # conversations with fewer turns (after the cut) are left out
    max_conversations: int = 0  # 0: all; else the first this many (by first turn)


def cut(trace: Trace, how: TraceCut) -> Trace:
    """The requests ``how`` keeps; a conversation that starts before the window starts at
    its first turn inside it (that turn's prompt, history included, is its first message)."""
    timed = trace.timed
    order = sorted(
        (
            (t.at_s or 0.0, c, i)
            for c, conv in enumerate(trace.conversations)
            for i, t in enumerate(conv.turns)
        ),
    )
    keep: set[tuple[int, int]] = set()
    for at, c, i in order:
        if timed and (at < how.start_s or (how.end_s > 0 and at >= how.end_s)):
            continue
        if how.max_requests and len(keep) >= how.max_requests:
            break
        keep.add((c, i))
    out: list[TraceConversation] = []
    for c, conv in enumerate(trace.conversations):
        turns = _consecutive([(i, t) for i, t in enumerate(conv.turns) if (c, i) in keep])
        if len(turns) < max(1, how.min_turns):
            continue
        out.append(replace(conv, turns=turns))
    out.sort(key=lambda conv: conv.turns[0].at_s or 0.0)
    if how.max_conversations:
        out = out[: how.max_conversations]
    if timed and out:
        t0 = min(conv.turns[0].at_s or 0.0 for conv in out)
        out = [
            replace(conv, turns=[replace(t, at_s=(t.at_s or 0.0) - t0) for t in conv.turns])
            for conv in out
        ]
    return trace.with_conversations(out)


def _consecutive(kept: list[tuple[int, TraceTurn]]) -> list[TraceTurn]:
    """The first run of consecutive turns; its first turn carries its whole recorded prompt
    when turns before it were cut (the history is then one message)."""
    if not kept:
        return []
    run = [kept[0]]
    for i, t in kept[1:]:
        if i != run[-1][0] + 1:
            break
        run.append((i, t))
    first_index, first = run[0]
    turns = [t for _, t in run]
    if first_index > 0:
        turns[0] = replace(first, user_tokens=max(first.user_tokens, first.input_tokens))
    return turns


def scaled(trace: Trace, length_scale: float, speedup: float = 1.0) -> Trace:
    """Every length times ``length_scale`` (at least 1), every time divided by ``speedup``."""

    def n(tokens: int) -> int:
        return max(1, round(tokens * length_scale))

    def turn(t: TraceTurn) -> TraceTurn:
        at = None if t.at_s is None else t.at_s / speedup
        return replace(
            t,
            user_tokens=n(t.user_tokens),
            output_tokens=n(t.output_tokens),
            input_tokens=n(t.input_tokens),
            at_s=at,
        )

    out = [
        replace(
            c,
            turns=[turn(t) for t in c.turns],
            system_tokens=n(c.system_tokens) if c.system_tokens else 0,
        )
        for c in trace.conversations
    ]
    result = trace.with_conversations(out)
    if trace.block_tokens:
        result.block_tokens = n(trace.block_tokens)
    return result


def longest_context(trace: Trace) -> int:
    return max((context_needed(c) for c in trace.conversations), default=0)


def largest_fitting_scale(trace: Trace, max_model_len: int) -> float:
    """The largest length scale (at most 1) at which every conversation fits
    ``max_model_len``, rounded down to ``SCALE_DIGITS`` significant digits (0 when even
    one token per length does not fit)."""
    if longest_context(scaled(trace, 1.0)) <= max_model_len:
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        if longest_context(scaled(trace, mid)) <= max_model_len:
            low = mid
        else:
            high = mid
    if low <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(low)) - SCALE_DIGITS + 1)
    value = math.floor(low / step) * step
    while value > 0 and longest_context(scaled(trace, value)) > max_model_len:
        value -= step  # float rounding of the product
    return float(f"{max(value, 0.0):.{SCALE_DIGITS}g}")
