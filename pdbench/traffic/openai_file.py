"""OpenAI-format conversation files, as vLLM's ``benchmarks/multi_turn`` reads them.

The file is a JSON list of ``{"id": ..., "messages": [{"role", "content"}, ...]}`` (or an
object mapping ids to message lists). Roles: an optional leading ``system``, then ``user``
and ``assistant`` in turn. Each user message is a turn, sent as written; the assistant
message after it is not sent: its length is the reply's (the model writes the reply, so the
history a turn carries is as long as the file's). The file has no times: a replay offers
its turns by the workload's arrival settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdbench.traffic.trace import Trace, TraceConversation, TraceError, TraceFormat, TraceTurn

ROLES = ("system", "user", "assistant")
TokenCount = Callable[[str], int]


def word_count(text: str) -> int:
    """A stand-in token count where no tokenizer is at hand: whitespace-separated words
    (exact for the generated tiny models' word-level tokenizer)."""
    return len(text.split())


def content_text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _items(path: str, data: Any) -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        return [(str(k), v) for k, v in data.items()]
    if not isinstance(data, list):
        raise TraceError(path, "", "is neither a list of conversations nor an object of them")
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "messages" not in item:
            raise TraceError(
                path, f"conversation {i}", "has no messages", '{"id": ..., "messages": [...]}'
            )
        out.append((str(item.get("id", i)), item["messages"]))
    return out


def parse_conversation(
    path: str, index: int, key: str, messages: Any, count: TokenCount, default_output: int
) -> tuple[TraceConversation, int]:
    """One conversation (and 1 when its last user message had no reply to size it)."""
    where = f"conversation {index} ({key})"
    if not isinstance(messages, list) or not messages:
        raise TraceError(path, where, "messages is not a non-empty list")
    system: str | None = None
    turns: list[TraceTurn] = []
    pending: tuple[str, str] | None = None  # a user message waiting for its reply
    for m, message in enumerate(messages):
        at = f"{where}, message {m}"
        if not isinstance(message, dict):
            raise TraceError(path, at, "is not an object", '{"role": ..., "content": ...}')
        role = message.get("role")
        if role not in ROLES:
            raise TraceError(
                path,
                f"{at}, role",
                f"{role!r} is not one of {', '.join(ROLES)}",
                "tool and function messages are not replayed: drop them or fold them into "
                "the user message",
            )
        text = content_text(message.get("content"))
        if text is None:
            raise TraceError(path, f"{at}, content", "is not text", "a string, or text parts")
        if role == "system":
            if m != 0:
                raise TraceError(path, f"{at}, role", "a system message after the first")
            system = text
        elif role == "user":
            if pending is not None:
                raise TraceError(
                    path,
                    f"{at}, role",
                    "two user messages in a row",
                    "join them into one, or put the reply between them",
                )
            pending = (text, at)
        else:
            if pending is None:
                raise TraceError(
                    path, f"{at}, role", "an assistant message with no user message before it"
                )
            turns.append(_turn(pending, count, count(text)))
            pending = None
    unsized = 0
    if pending is not None:
        turns.append(_turn(pending, count, default_output))
        unsized = 1
    if not turns:
        raise TraceError(path, where, "has no user message")
    conversation = TraceConversation(
        key, turns, system_text=system, system_tokens=count(system) if system else 0
    )
    return conversation, unsized


def _turn(user: tuple[str, str], count: TokenCount, output_tokens: int) -> TraceTurn:
    text, at = user
    return TraceTurn(max(1, count(text)), max(1, output_tokens), user_text=text, source=at)


def read_openai(path: str | Path, count: TokenCount, default_output: int) -> Trace:
    name = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(
            name, f"line {exc.lineno}, column {exc.colno}", f"is not JSON ({exc.msg})"
        ) from None
    items = _items(name, data)
    if not items:
        raise TraceError(name, "", "has no conversations")
    seen: set[str] = set()
    conversations, unsized = [], 0
    for i, (key, messages) in enumerate(items):
        if key in seen:
            raise TraceError(name, f"conversation {i}", f"id {key!r} is used twice")
        seen.add(key)
        conversation, missing = parse_conversation(name, i, key, messages, count, default_output)
        conversations.append(conversation)
        unsized += missing
    notes = []
    if unsized:
        notes.append(
            f"{unsized} conversation(s) end with a user message and no reply: its reply is "
            f"{default_output} tokens (workload.output_tokens)"
        )
    return Trace(TraceFormat.openai, name, conversations, notes=notes)
