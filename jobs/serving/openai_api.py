"""The OpenAI API as clients speak it, onto the token-id completions the router sends P and D.

Every request reaches P and D as a ``/v1/completions`` request whose prompt is token ids.
A chat request's messages, or a completion's text prompt, are first turned into ids by the
serving instance's own ``/tokenize`` (its chat template, its tokenizer), and D's streamed
completion goes back to a chat client as chat chunks. Why not forward chat to vLLM's chat
endpoint: the router checks that a prompt extends exactly the tokens D holds before it lets
P pull them (``jobs.serving.sessions``); the ids it checks must be the ids P and D then
compute, so the router tokenizes once and sends those ids. Forwarding the messages would
have each server tokenize again, and the check would be about other ids than the ones run.

Not translated (answered 400 with the reason): tools (tool-call parsing), chat logprobs
(another format), ``n`` > 1 and beam search (one sequence per turn is what D holds),
``echo``, and message parts other than text.
"""

from __future__ import annotations

import json
import time
from typing import Any

# Chat fields that shape the prompt (they go to /tokenize) or have no completions meaning.
TEMPLATE_KEYS = (
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
CHAT_ONLY_KEYS = frozenset(
    {
        "messages",
        "max_completion_tokens",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "top_logprobs",
        "documents",
        "include_reasoning",
        "reasoning_effort",
        "return_prompt_text",
        "conversation_id",  # vLLM's multi_turn client: the session, read by the router
        *TEMPLATE_KEYS,
    }
)
CHAT = "chat"
COMPLETIONS = "completions"


def unsupported(body: dict[str, Any], api: str) -> str | None:
    """Why the router cannot serve this request (a 400's message), or None."""
    if (body.get("n") or 1) != 1 or body.get("use_beam_search"):
        return "n > 1 and beam search are not routed: a turn is one sequence (n=1)"
    if body.get("echo"):
        return "echo is not routed: send the prompt's text yourself"
    if api == COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return None
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return None
        return "prompt: one text or one list of token ids (no batches, no embeddings)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: a non-empty list of chat messages"
    if body.get("tools") and body.get("tool_choice") != "none":
        return "tools: the router relays text; tool calls are not parsed (tool_choice='none')"
    if body.get("logprobs") or body.get("top_logprobs"):
        return "logprobs are not translated to the chat format; use /v1/completions"
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type") != "text" for part in content
        ):
            return "message content parts other than text are not routed"
    return None


def model_problem(body: dict[str, Any], served: str) -> str | None:
    """A model the deployment does not serve (a 404's message, as vLLM words it), or None.
    No model named, or no served name known: nothing to check."""
    model = body.get("model")
    if not served or model in (None, "", served):
        return None
    return f"The model `{model}` does not exist."


def length_problem(body: dict[str, Any], prompt_tokens: int, max_model_len: int) -> str | None:
    """A token budget vLLM would refuse (a 400's message), checked before P works on the
    prompt: ``max_tokens`` (chat: ``max_completion_tokens`` too) a whole number >= 1, and
    the prompt plus it within the context. ``max_model_len`` 0: the context is not known."""
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{key} must be a whole number of at least 1, got {value!r}"
    if not max_model_len:
        return None
    if prompt_tokens >= max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_tokens} tokens. Please reduce the length of the prompt."
        )
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    if asked is not None and prompt_tokens + asked > max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{prompt_tokens} tokens and {asked} output tokens were asked for "
            f"(max_tokens at most {max_model_len - prompt_tokens})."
        )
    return None


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error answer in vLLM's OpenAI server's shape."""
    kind = {400: "BadRequestError", 401: "Unauthorized", 404: "NotFoundError"}.get(
        status, "BadGateway" if status >= 500 else "BadRequestError"
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# Keys of an upstream body that clients must never see: D's (or P's) KV-transfer params name
# the instance's host, port and block ids.
INTERNAL_KEYS = ("kv_transfer_params",)


def without_internals(body: Any) -> Any:
    """A completion body (or a streamed chunk's) without ``INTERNAL_KEYS``."""
    if isinstance(body, dict) and any(k in body for k in INTERNAL_KEYS):
        return {k: v for k, v in body.items() if k not in INTERNAL_KEYS}
    return body


def needs_tokens(body: dict[str, Any], api: str) -> bool:
    """Whether the prompt must be tokenized first (chat, or a text completion)."""
    return api == CHAT or isinstance(body.get("prompt"), str)


def tokenize_request(body: dict[str, Any], api: str) -> dict[str, Any]:
    """The ``/tokenize`` body that gives this request's prompt ids as its server would."""
    if api == COMPLETIONS:
        return {
            "model": body.get("model"),
            "prompt": body["prompt"],
            "add_special_tokens": body.get("add_special_tokens", True),
        }
    out = {"model": body.get("model"), "messages": body["messages"]}
    for key in (*TEMPLATE_KEYS, "add_special_tokens"):
        if key in body:
            out[key] = body[key]
    if body.get("tools"):
        out["tools"] = body["tools"]
    return out


def completion_request(body: dict[str, Any], api: str, prompt: list[int]) -> dict[str, Any]:
    """The token-id completion P and D run for this request."""
    out = {k: v for k, v in body.items() if k not in CHAT_ONLY_KEYS}
    out["prompt"] = prompt
    out.pop("add_special_tokens", None)  # ids are final
    if api == CHAT:
        # chat's default: as many tokens as the context leaves (completions' default is 16)
        out["max_tokens"] = body.get("max_completion_tokens", body.get("max_tokens"))
    return out


def chat_choice(choice: dict[str, Any], first: bool) -> dict[str, Any]:
    """One completion stream choice as a chat stream choice (the role on the first)."""
    delta: dict[str, Any] = {"content": choice.get("text") or ""}
    if first:
        delta = {"role": "assistant", **delta}
    out = {
        "index": choice.get("index", 0),
        "delta": delta,
        "logprobs": None,
        "finish_reason": choice.get("finish_reason"),
    }
    if choice.get("stop_reason") is not None:
        out["stop_reason"] = choice["stop_reason"]
    if choice.get("token_ids") is not None:
        out["token_ids"] = choice["token_ids"]
    return out


def completion_tokens(payload: bytes) -> int:
    """``usage.completion_tokens`` of an answer or a streamed event's JSON (-1: none)."""
    if b'"completion_tokens"' not in payload:
        return -1
    try:
        usage = (json.loads(payload) or {}).get("usage") or {}
    except (ValueError, AttributeError):
        return -1
    value = usage.get("completion_tokens")
    return value if isinstance(value, int) else -1


def asks_usage(body: dict[str, Any]) -> bool:
    """Whether a streamed request asks for the usage event."""
    return bool((body.get("stream_options") or {}).get("include_usage"))


def with_usage(body: dict[str, Any]) -> dict[str, Any]:
    """The request with the stream's final usage event asked for."""
    return {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}


def usage_only(data: dict[str, Any]) -> bool:
    """A stream's final usage event (no choices), which a client that asked none never sees."""
    return "usage" in data and not data.get("choices")


class ChatStream:
    """D's completion stream (SSE bytes as they arrive) as a chat stream. Events are
    translated whole; a partial event waits for the rest of it. The role goes with the first
    content, so a client times its first token at D's first token."""

    def __init__(self, request_id: str, loads, dumps, hide_usage: bool = False):
        self.id = f"chatcmpl-{request_id}"
        self.created = int(time.time())
        self.loads, self.dumps = loads, dumps
        self.buffer = b""
        self.first = True
        self.completion_tokens = -1  # from the usage event
        self.hide_usage = hide_usage  # the router asked for it, the client did not

    def feed(self, data: bytes) -> bytes:
        """The chat events for what ``data`` completes (b"" when it completes none)."""
        self.buffer += data
        *events, self.buffer = self.buffer.split(b"\n\n")
        return b"".join(self._event(e) for e in events)

    def _event(self, event: bytes) -> bytes:
        line = event.strip()
        if not line.startswith(b"data:"):
            return b""
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return b"data: [DONE]\n\n"
        data = self.loads(payload)
        if "error" in data or "choices" not in data:
            return b"data: " + payload + b"\n\n"
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": data.get("model"),
            "choices": [chat_choice(c, self.first) for c in data.get("choices") or []],
        }
        if chunk["choices"]:
            self.first = False
        if "usage" in data:
            chunk["usage"] = data["usage"]
            tokens = (data["usage"] or {}).get("completion_tokens")
            if isinstance(tokens, int):
                self.completion_tokens = tokens
            if self.hide_usage and usage_only(data):
                return b""
        return b"data: " + self.dumps(chunk) + b"\n\n"


class CompletionStream:
    """D's completion stream as the client gets it: the same events, ``INTERNAL_KEYS`` taken
    out of any that carries them (vLLM 0.33 puts D's KV params on the final chunk). Events
    are passed whole; a partial one waits for the rest of it (vLLM writes events whole, so
    nothing waits in practice)."""

    def __init__(self, loads, dumps, hide_usage: bool = False):
        self.loads, self.dumps = loads, dumps
        self.buffer = b""
        self.completion_tokens = -1  # from the usage event
        self.hide_usage = hide_usage  # the router asked for it, the client did not

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        *events, self.buffer = self.buffer.split(b"\n\n")
        return b"".join(out + b"\n\n" for e in events if (out := self._event(e)))

    def _event(self, event: bytes) -> bytes:
        if b'"completion_tokens"' in event:
            payload = event.partition(b"data:")[2].strip()
            tokens = completion_tokens(payload)
            if tokens >= 0:
                self.completion_tokens = tokens
            if self.hide_usage and usage_only(self.loads(payload)):
                return b""
        if not any(k.encode() in event for k in INTERNAL_KEYS):
            return event
        head, _, payload = event.partition(b"data:")
        try:
            data = self.loads(payload.strip())
        except ValueError:
            return event
        return head + b"data: " + self.dumps(without_internals(data))


def chat_response(completion: dict[str, Any], request_id: str) -> dict[str, Any]:
    """A non-streamed completion answer as a chat completion."""
    choices = []
    for c in completion.get("choices") or []:
        choice = {
            "index": c.get("index", 0),
            "message": {"role": "assistant", "content": c.get("text") or ""},
            "logprobs": None,
            "finish_reason": c.get("finish_reason"),
            "stop_reason": c.get("stop_reason"),
        }
        if c.get("token_ids") is not None:
            choice["token_ids"] = c["token_ids"]
        choices.append(choice)
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": completion.get("created", int(time.time())),
        "model": completion.get("model"),
        "choices": choices,
        "usage": completion.get("usage"),
    }
