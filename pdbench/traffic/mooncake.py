"""Mooncake's trace format: one request a line, conversations found by shared block ids.

A line is ``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids":
[...]}``; each hash id stands for one block of ``block_tokens`` prompt tokens (512 in
Mooncake's release), equal ids for equal blocks. A request whose ids begin with every id of
an earlier request (or with every id of its full blocks: the last, partial block's id
changes once it fills, so a match on full blocks also needs the prompt to have grown by
the earlier reply) is that request's next turn; the longest such earlier request is its
parent. When the parent already has a next turn, the request starts a conversation of its
own that shares the parent's blocks (a branch: a regenerated or forked reply).

A caveat: a first prompt that is a shared system prompt and one partial block can take in
another conversation sharing that system prompt whose first prompt is long enough; where
conversations share a prefix as long as their first prompts, read the notes and the shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pdbench.traffic.trace import Trace, TraceConversation, TraceError, TraceFormat, TraceTurn

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True)
class MooncakeRequest:
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_line(path: str, number: int, text: str) -> MooncakeRequest:
    """One line, every field checked (the file, the line and the field named when wrong)."""
    where = f"line {number}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            path, where, f"is not JSON ({exc.msg})", "one JSON object a line"
        ) from None
    if not isinstance(row, dict):
        raise TraceError(path, where, "is not a JSON object", "one JSON object a line")
    missing = [f for f in FIELDS if f not in row]
    if missing:
        raise TraceError(
            path, where, f"has no {', '.join(missing)}", f"every line has {', '.join(FIELDS)}"
        )
    stamp = row["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or stamp < 0:
        raise TraceError(path, f"{where}, timestamp", f"{stamp!r} is not ms >= 0")
    for name in ("input_length", "output_length"):
        value = row[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceError(path, f"{where}, {name}", f"{value!r} is not a token count")
    if row["input_length"] < 1:
        raise TraceError(path, f"{where}, input_length", "is 0: a request has a prompt")
    ids = row["hash_ids"]
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise TraceError(path, f"{where}, hash_ids", "is not a list of integers")
    return MooncakeRequest(
        number, float(stamp), row["input_length"], row["output_length"], tuple(ids)
    )


def read_requests(path: str | Path) -> tuple[list[MooncakeRequest], list[str]]:
    """Every request of the file in timestamp order, and a note when it was not in order
    (sorted, not refused: merged logs are often slightly out of order)."""
    name = str(path)
    requests = [
        parse_line(name, n, line)
        for n, line in enumerate(Path(path).read_text().splitlines(), start=1)
        if line.strip()
    ]
    if not requests:
        raise TraceError(name, "", "has no requests", "a JSONL file, one request a line")
    notes = []
    late = sum(
        b.timestamp_ms < a.timestamp_ms for a, b in zip(requests, requests[1:], strict=False)
    )
    if late:
        notes.append(f"{late} line(s) earlier than the line before: sorted by timestamp")
        requests.sort(key=lambda r: (r.timestamp_ms, r.line))
    return requests, notes


def reconstruct(
    requests: list[MooncakeRequest], block_tokens: int
) -> tuple[list[TraceConversation], list[str]]:
    """The conversations of ``requests`` (in timestamp order), and what reconstruction had
    to assume (branches, turns whose prompt does not hold the last reply)."""
    t0 = requests[0].timestamp_ms
    conversations: list[TraceConversation] = []
    last_input: list[tuple[int, int, tuple[int, ...]]] = []  # per conversation
    # ids -> (conversation, turn, the input a next turn needs to match on these ids)
    index: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}
    branches = short = 0
    for r in requests:
        parent = _parent(r, index, [len(c.turns) for c in conversations])
        at_s = (r.timestamp_ms - t0) / 1000.0
        source = f"line {r.line}"
        output = max(1, r.output_length)
        if parent is not None and parent[1] == len(conversations[parent[0]].turns) - 1:
            c, _ = parent
            prev_in, prev_out, prev_ids = last_input[c]
            user = r.input_length - prev_in - prev_out
            if user < 1:
                short += 1
                user = max(1, r.input_length - prev_in)  # what it adds to the last prompt
            new = r.hash_ids[_shared(prev_ids, r.hash_ids) :]
            turn = TraceTurn(user, output, at_s, r.input_length, new, source=source)
            conversations[c].turns.append(turn)
            last_input[c] = (r.input_length, output, r.hash_ids)
        else:
            branch_of = ""
            if parent is not None:
                branches += 1
                branch_of = conversations[parent[0]].key
            first = TraceTurn(
                r.input_length, output, at_s, r.input_length, r.hash_ids, source=source
            )
            conversations.append(TraceConversation(f"line {r.line}", [first], branch_of=branch_of))
            last_input.append((r.input_length, output, r.hash_ids))
            c = len(conversations) - 1
        turn_index = len(conversations[c].turns) - 1
        for key, needs in _keys(r, block_tokens):
            index.setdefault(key, []).append((c, turn_index, needs))
    notes = []
    if branches:
        notes.append(
            f"{branches} request(s) extend a turn that already had a next one: each starts a "
            "conversation of its own sharing that turn's blocks (a branch)"
        )
    if short:
        notes.append(
            f"{short} turn(s) have a prompt shorter than the last prompt and its reply: their "
            "user message is what they add to the last prompt (the replay's history holds "
            "the reply too)"
        )
    return conversations, notes


def _keys(r: MooncakeRequest, block_tokens: int) -> list[tuple[tuple[int, ...], int]]:
    """What a later turn's ids may begin with, and the prompt length it then needs: all of
    this prompt's ids (any length), or those of its full blocks (at least this prompt and
    its reply: full blocks alone may be no more than a system prompt other conversations
    share too)."""
    keys = [(r.hash_ids, 0)]
    full = r.input_length // block_tokens
    if 0 < full < len(r.hash_ids):
        keys.append((r.hash_ids[:full], r.input_length + r.output_length))
    return keys


def _parent(r: MooncakeRequest, index: dict, turns: list[int]) -> tuple[int, int] | None:
    """The turn ``r`` extends: of the turns whose ids (or full blocks' ids) are the longest
    prefix of its ids, the latest that is still its conversation's last (a turn that adds
    less than a block has the full blocks of the turn before it); else the latest."""
    ids = r.hash_ids
    for n in range(len(ids) - 1, 0, -1):
        hits = [(c, t) for c, t, needs in index.get(ids[:n], ()) if r.input_length >= needs]
        if hits:
            open_ends = [(c, t) for c, t in hits if t == turns[c] - 1]
            return (open_ends or hits)[-1]
    return None


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def read_mooncake(path: str | Path, block_tokens: int) -> Trace:
    requests, notes = read_requests(path)
    conversations, more = reconstruct(requests, block_tokens)
    return Trace(TraceFormat.mooncake, str(path), conversations, block_tokens, notes + more)
