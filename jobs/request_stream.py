"""One streamed request and its clock: what the load generator sends and how it times it.

The request bodies (``completion_body``), the send (``stream_one``), and the reading of the
answer as it arrives: per read from the socket one clock read (``ChunkClock``), then cheap
parsing (``_handle_event`` with a msgspec decoder of just the fields it reads), so that
what one stream spends delays no other stream's timestamps.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from connector.process_env import bearer
from jobs.serving.router_headers import (
    CONVERSATION_HEADER,
    PATH_HEADER,
    PREFILL_MS_HEADER,
    REQUEST_ID_HEADER,
    ROUTER_SPANS_HEADER,
    TURN_HEADER,
    parse_spans,
)
from records.point import RequestRecord


@dataclass
class RequestOptions:
    url: str  # router or server base URL
    model: str
    output_tokens: int
    flow: str
    salt: str  # cache_salt: isolates one Point's prefix-cache entries from another's
    timeout_s: float = 120.0
    api: str = "completions"  # completions (token ids) | chat (messages as text)


def completion_body(
    opts: RequestOptions, prompt: list[int], output_tokens: int | None = None
) -> dict:
    """A greedy streaming completion of exactly ``output_tokens`` (None: the options')."""
    n = opts.output_tokens if output_tokens is None else output_tokens
    return {
        "model": opts.model,
        "prompt": prompt,
        "max_tokens": n,
        "min_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "cache_salt": opts.salt,
    }


def chat_body(
    opts: RequestOptions, messages: list[dict[str, str]], output_tokens: int | None = None
) -> dict:
    """The same greedy streaming request as ``completion_body``, as a chat client sends it
    (``return_token_ids``: vLLM's extension, kept by the router, gives the output's ids)."""
    n = opts.output_tokens if output_tokens is None else output_tokens
    return {
        "model": opts.model,
        "messages": messages,
        "max_completion_tokens": n,
        "min_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "cache_salt": opts.salt,
    }


async def stream_one(
    session,
    opts: RequestOptions,
    conv: int,
    turn: int,
    prompt: list[int],
    history: int,
    t0: float,
    output_tokens: int | None = None,
    messages: list[dict[str, str]] | None = None,
    texts: list[str] | None = None,
) -> RequestRecord:
    """Send one streaming completion (a chat completion of ``messages`` when given: then
    ``prompt`` holds only what is known of its ids, the server's count replaces its length,
    and ``texts`` collects the answer's text); time each chunk of tokens on arrival
    (``ChunkClock``)."""
    record = RequestRecord(
        conversation=conv,
        turn=turn,
        flow=opts.flow,
        prompt_tokens=len(prompt),
        history_tokens=history,
        output_token_ids=[],
        ttft_ms=0.0,
        itl_ms=[],
        e2e_ms=0.0,
        start_s=time.perf_counter() - t0,
    )
    headers = {
        CONVERSATION_HEADER: f"{opts.salt}:{conv}",
        TURN_HEADER: str(turn),
        "Content-Type": "application/json",
        **bearer(os.environ),  # the router's key, when it has one
    }
    if messages is None:
        url, data = (
            f"{opts.url}/v1/completions",
            _encode(completion_body(opts, prompt, output_tokens)),
        )
    else:
        url = f"{opts.url}/v1/chat/completions"
        data = _encode(chat_body(opts, messages, output_tokens))
        texts = texts if texts is not None else []
    clock = ChunkClock(record, time.perf_counter(), texts)
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            record.path = resp.headers.get(PATH_HEADER, "")
            record.prefill_ms = float(resp.headers.get(PREFILL_MS_HEADER, -1.0))
            record.request_id = resp.headers.get(REQUEST_ID_HEADER, "")
            record.router_spans_ms = parse_spans(resp.headers.get(ROUTER_SPANS_HEADER, ""))
            if resp.status != 200:
                text = await resp.text()
                raise RuntimeError(f"HTTP {resp.status}: {text[:500]}")
            # Per read: one clock read, then cheap parsing (see _fast_decoder): what this loop
            # spends delays the timestamps of every other stream sharing the event loop.
            async for chunk in resp.content.iter_any():
                clock.feed(chunk, time.perf_counter())
        if not record.output_token_ids:
            raise RuntimeError("stream ended without tokens")
    except Exception as exc:  # recorded, never dropped
        record.status = "failed"
        record.error = describe_failure(exc, opts.timeout_s)
    clock.finish(time.perf_counter())
    return record


class ChunkClock:
    """Times one streamed answer chunk by chunk, as ``vllm bench serve`` does.

    A chunk is what one read from the socket brought: SSE events that arrive together cannot
    be told apart in time, so their tokens count as one chunk (vLLM itself puts several
    tokens in one event when its output lags the engine). TTFT: start to the first chunk
    with tokens; ITL: gaps between consecutive chunks with tokens, one per chunk after the
    first (never 0 for the extra tokens of a chunk); ``chunk_tokens``: tokens per chunk; E2E:
    start to the last chunk with tokens (the usage event and ``[DONE]`` after it excluded);
    TPOT: ``tpot_ms``.
    """

    def __init__(self, record: RequestRecord, start: float, texts: list[str] | None = None):
        self.record = record
        self.start = start
        self.last = start
        self.buffer = b""
        self.texts = texts  # a chat answer's text pieces (None: not collected)

    def feed(self, data: bytes, now: float) -> None:
        """Parse what one read brought at ``now`` (perf_counter seconds)."""
        self.buffer += data
        *events, self.buffer = self.buffer.split(b"\n\n")
        tokens = 0
        try:
            for event in events:
                tokens += _handle_event(event, self.record, self.texts)
        finally:  # a server error after some tokens still times the tokens before it
            if tokens:
                self._chunk(tokens, now)

    def _chunk(self, tokens: int, now: float) -> None:
        record = self.record
        if record.chunk_tokens:
            record.itl_ms.append((now - self.last) * 1e3)
        else:
            record.ttft_ms = (now - self.start) * 1e3
        record.chunk_tokens.append(tokens)
        self.last = now

    def finish(self, now: float) -> None:
        """Close the record: E2E (to the last token, or to ``now`` if it failed) and TPOT."""
        record = self.record
        end = self.last if record.status == "ok" and record.chunk_tokens else now
        record.e2e_ms = (end - self.start) * 1e3
        record.tpot_ms = tpot_ms(record.ttft_ms, record.e2e_ms, len(record.output_token_ids))


def tpot_ms(ttft_ms: float, e2e_ms: float, tokens: int) -> float:
    """Time per output token after the first: (E2E - TTFT) / (tokens - 1); 0 for one token
    or none (``vllm bench serve``'s TPOT, ``benchmarks/serve.py``)."""
    return (e2e_ms - ttft_ms) / (tokens - 1) if tokens > 1 else 0.0


def describe_failure(exc: BaseException, timeout_s: float) -> str:
    """A failed request's error line; a bare timeout says which limit it hit."""
    if isinstance(exc, TimeoutError) and not str(exc):
        return (
            f"TimeoutError: no complete answer within {timeout_s:g} s "
            "(workload.request_timeout_s; a stalled server also shows here)"
        )
    return f"{type(exc).__name__}: {exc}"


def _handle_event(event: bytes, record: RequestRecord, texts: list[str] | None = None) -> int:
    """Parse one SSE event into the record; returns how many tokens it carried. With
    ``texts`` (a chat answer) the text pieces go there and the server's prompt count into
    the record."""
    line = event.strip()
    if not line.startswith(b"data:"):
        return 0
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return 0
    fast = _fast_decoder()
    if fast is not None:
        decoder, unset = fast
        try:
            event = decoder.decode(payload)
        except Exception:  # anything unexpected: the plain path below decides, as before
            event = None
        if event is not None:
            if event.error is not unset:
                raise RuntimeError(f"server error: {event.error}")
            details = event.usage.prompt_tokens_details if event.usage else None
            if details is not None and details.cached_tokens is not None:
                record.cached_tokens = details.cached_tokens
            if texts is not None and event.usage and event.usage.prompt_tokens is not None:
                record.prompt_tokens = event.usage.prompt_tokens
            n = 0
            for choice in event.choices or ():
                if choice.token_ids:
                    record.output_token_ids.extend(choice.token_ids)
                    n += len(choice.token_ids)
                if texts is not None and choice.delta is not None and choice.delta.content:
                    texts.append(choice.delta.content)
            return n
    data = json.loads(payload)
    if "error" in data:
        raise RuntimeError(f"server error: {data['error']}")
    usage = data.get("usage")
    if usage:
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            record.cached_tokens = int(details["cached_tokens"])
        if texts is not None and usage.get("prompt_tokens") is not None:
            record.prompt_tokens = int(usage["prompt_tokens"])
    n = 0
    for choice in data.get("choices") or []:
        ids = choice.get("token_ids") or []
        record.output_token_ids.extend(ids)
        n += len(ids)
        content = (choice.get("delta") or {}).get("content")
        if texts is not None and content:
            texts.append(content)
    return n


@functools.cache
def _fast_decoder() -> tuple[Any, Any] | None:
    """A msgspec decoder of just the fields ``_handle_event`` reads, and msgspec's UNSET;
    None without msgspec (a vLLM dependency), then ``json`` is used. Per token it is ~10x
    cheaper than ``json.loads`` (0.3 us vs 3 us), and it skips the prompt's ids vLLM echoes
    in the first chunk (``return_token_ids``) without building them: a 16k-id first chunk
    blocks the event loop ~0.1 ms instead of ~0.9 ms."""
    try:
        import msgspec  # lazy: optional: faster JSON when installed
    except ImportError:
        return None

    def struct(name, fields):  # defstruct: real types, not this module's string annotations
        return msgspec.defstruct(name, fields, gc=False)

    details = struct("Details", [("cached_tokens", int | None, None)])
    usage = struct(
        "Usage",
        [("prompt_tokens_details", details | None, None), ("prompt_tokens", int | None, None)],
    )
    delta = struct("Delta", [("content", str | None, None)])  # chat answers only
    choice = struct(
        "Choice", [("token_ids", list[int] | None, None), ("delta", delta | None, None)]
    )
    event = struct(
        "Event",
        [
            ("choices", list[choice] | None, None),
            ("usage", usage | None, None),
            ("error", Any, msgspec.UNSET),
        ],
    )
    return msgspec.json.Decoder(event), msgspec.UNSET


def _encode(body: dict) -> bytes:
    """The request body as JSON bytes; msgspec if present: for a 16k-token prompt 0.07 ms of
    event loop instead of 0.9 ms with ``json.dumps`` (what aiohttp's ``json=`` uses)."""
    try:
        import msgspec  # lazy: optional: faster JSON when installed
    except ImportError:
        return json.dumps(body).encode()
    return msgspec.json.encode(body)
