"""A recorded session: the request log a pdbench router writes of every client it serves
(``logs/<deployment>/router_requests.jsonl``, one JSON object a request).

Each line names its conversation (``session``; "" for a request that named none: it is a
conversation of one turn), when it arrived (``at``, unix s), its prompt's length
(``prompt_tokens``), its reply's (``output_tokens``), where it parted from D's tokens
(``diverged_at``, -1: it did not) and its HTTP ``status``. The log keeps lengths, not text:
a replay sends seeded tokens of the same lengths, in the same conversations, order and gaps.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdbench.traffic.trace import Trace, TraceConversation, TraceError, TraceFormat, TraceTurn

REQUIRED = ("session", "at", "prompt_tokens", "status")
# pdbench's own warm-up before serving (``jobs/run/warm_up.py`` tags its turns so, and the
# router's request ids carry the tag): not the client's traffic, never replayed
WARMUP_TAG = "warmup-"
WARMUP_REQUEST = f"pdb-{WARMUP_TAG}"


def _row(path: str, number: int, text: str) -> dict:
    where = f"line {number}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, where, f"is not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise TraceError(path, where, "is not a JSON object")
    missing = [f for f in REQUIRED if f not in row]
    if missing:
        raise TraceError(
            path, where, f"has no {', '.join(missing)}", "a router_requests.jsonl of pdbench's"
        )
    for name in ("at", "prompt_tokens", "status"):
        value = row[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise TraceError(path, f"{where}, {name}", f"{value!r} is not a number >= 0")
    return row


def read_recorded(path: str | Path, default_output: int) -> Trace:
    name = str(path)
    lines = [
        (n, _row(name, n, text))
        for n, text in enumerate(Path(path).read_text().splitlines(), start=1)
        if text.strip()
    ]
    clients = [
        (n, r) for n, r in lines if not str(r.get("request_id", "")).startswith(WARMUP_REQUEST)
    ]
    served = [(n, r) for n, r in clients if r["status"] == 200 and r["prompt_tokens"] > 0]
    if not served:
        raise TraceError(name, "", "has no request answered 200", "record a session first")
    served.sort(key=lambda nr: (nr[1]["at"], nr[0]))
    t0 = served[0][1]["at"]
    sessions: dict[str, TraceConversation] = {}
    held: dict[str, int] = {}  # tokens of the last prompt and its reply, per session
    conversations: list[TraceConversation] = []
    unsized = short = 0
    for n, r in served:
        output = r.get("output_tokens")
        if not isinstance(output, int) or output < 1:
            unsized += 1
            output = default_output
        key = str(r["session"] or "")
        prompt = int(r["prompt_tokens"])
        diverged = int(r.get("diverged_at", -1)) >= 0
        state = sessions.get(key) if key else None
        if state is None:
            user = prompt
        else:
            user = prompt - held[key]
            if user < 1:
                short += 1
                user = 1
        turn = TraceTurn(
            user,
            output,
            float(r["at"]) - t0,
            prompt,
            source=f"line {n}",
            diverged=diverged and state is not None,
        )
        if state is None:
            state = TraceConversation(key or f"line {n}", [turn])
            conversations.append(state)
            if key:
                sessions[key] = state
        else:
            state.turns.append(turn)
        if key:
            held[key] = prompt + output
    notes = []
    if len(clients) < len(lines):
        notes.append(f"{len(lines) - len(clients)} warm-up request(s) of pdbench's own: left out")
    if len(served) < len(clients):
        notes.append(f"{len(clients) - len(served)} request(s) not answered 200: left out")
    if unsized:
        notes.append(
            f"{unsized} request(s) without output_tokens (a log from before they were "
            f"recorded): their reply is {default_output} tokens (workload.output_tokens)"
        )
    if short:
        notes.append(
            f"{short} turn(s) shorter than their history (an edited history): 1 new token each"
        )
    return Trace(TraceFormat.pdbench, name, conversations, notes=notes)
