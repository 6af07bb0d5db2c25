"""A calibrated token source: an OpenAI-completions SSE server whose timing is the truth.

It answers ``POST /v1/completions`` (streaming) like vLLM does with ``return_token_ids``:
one token per chunk (or ``--chunk-tokens`` of them, as vLLM sends when its output lags the
engine or with ``--stream-interval``), ``token_ids`` (and ``text``) in each,
``prompt_token_ids`` in the first when the prompt is token ids, ``finish_reason`` on the last
chunk, a ``usage`` chunk, then ``[DONE]``. Token ``k`` is due at ``arrival + ttft + k * itl``
(an absolute schedule: a late token does not push the later ones back); a chunk goes when its
last token is due. Just before handing each chunk to the socket it records
``time.perf_counter()``; those send times, not the schedule, are the truth a client's
measurements are compared with (on Linux ``perf_counter`` is ``CLOCK_MONOTONIC``, one clock
for every process on the host).

Run it in its own process, so that it does not share an event loop with the client measured::

    python -m benchmarks.token_source --port 8123 --ttft-ms 50 --itl-ms 10 --chunk-tokens 1,3

Control: ``GET /health``, ``GET /v1/models``, ``GET /truth`` (every request since the last
reset: arrival, due and send times and tokens of each chunk, token ids, the
``X-Pdbench-Conversation`` header),
``POST /reset`` (clears the truth; optional JSON ``{"ttft_ms": .., "itl_ms": ..}``).
Token ids are a pure function of the request's serial number, and each token's text names
its serial (`` s<serial>t<k>``), so a client that keeps only the text can be matched too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from dataclasses import asdict, dataclass, field
from json.encoder import encode_basestring_ascii as _json_str

FIRST_ID = 3  # like the tiny tokenizer: 0-2 are special tokens
CONVERSATION_HEADER = "X-Pdbench-Conversation"
DONE = b"data: [DONE]\n\n"
# aiohttp's default accept queue is 128: 256 clients connecting at once overflow it, and each
# dropped SYN is retried after 1, 3, 7, ... s, a TTFT outlier that is no one's latency.
LISTEN_BACKLOG = 2048
_TEXT = re.compile(r"s(\d+)t\d+")


@dataclass(frozen=True)
class Schedule:
    """When each token of one request is due, in seconds after the request arrived."""

    ttft_s: float
    itl_s: float
    tokens: int

    def offset_s(self, k: int) -> float:
        if not 0 <= k < self.tokens:
            raise IndexError(f"token {k} of {self.tokens}")
        return self.ttft_s + k * self.itl_s

    def offsets_s(self) -> list[float]:
        return [self.offset_s(k) for k in range(self.tokens)]

    def wait_s(self, k: int, arrival_s: float, now_s: float) -> float:
        """How long to sleep before token ``k`` (0 when it is already due or late)."""
        return max(0.0, arrival_s + self.offset_s(k) - now_s)


def token_ids(serial: int, n: int, vocab_size: int = 512) -> list[int]:
    """The ids request ``serial`` gets: deterministic, distinct between neighbouring serials."""
    span = max(1, vocab_size - FIRST_ID)
    return [FIRST_ID + (serial * 131 + k * 17) % span for k in range(n)]


def token_text(serial: int, k: int) -> str:
    return f" s{serial}t{k}"


def chunk_sizes(tokens: int, pattern: tuple[int, ...]) -> list[int]:
    """Tokens per chunk of a ``tokens``-long answer: ``pattern`` repeated, the last chunk cut
    to what is left."""
    if not pattern or min(pattern) < 1:
        raise ValueError(f"chunk pattern must be positive token counts, got {pattern}")
    sizes: list[int] = []
    left = tokens
    while left > 0:
        size = min(pattern[len(sizes) % len(pattern)], left)
        sizes.append(size)
        left -= size
    return sizes


def serial_from_text(text: str) -> int | None:
    """The serial of the request whose generated text this is (None if not ours)."""
    m = _TEXT.search(text or "")
    return int(m.group(1)) if m else None


def sched_ms(path: str = "/proc/thread-self/schedstat") -> dict[str, float]:
    """A thread's CPU time and time spent runnable but waiting for a CPU (Linux schedstat;
    this thread by default, ``/proc/<pid>/schedstat`` for a process's main thread), in ms;
    empty where unavailable."""
    try:
        with open(path) as f:
            cpu_ns, wait_ns, _ = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        return {}
    return {"cpu_ms": cpu_ns / 1e6, "run_delay_ms": wait_ns / 1e6}


def sched_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before if k in after}


def intervals_ms(times_s: list[float]) -> list[float]:
    """Gaps between consecutive timestamps, in ms."""
    return [(b - a) * 1e3 for a, b in zip(times_s, times_s[1:], strict=False)]


def token_chunk(
    rid: str,
    model: str,
    created: int,
    ids: list[int],
    text: str,
    finish: str | None,
    prompt_ids: list[int] | None = None,
) -> bytes:
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_token_ids": prompt_ids,
        "token_ids": ids,
    }
    body = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


class ChunkTemplate:
    """``token_chunk`` of one request for a middle chunk (no prompt ids, no finish reason),
    pasted from pieces rendered once: no ``json.dumps`` per token, so the source spends less
    of the CPU it shares with the client it measures."""

    _TEXT, _ID = "\x01text\x01", 987654321

    def __init__(self, rid: str, model: str, created: int):
        whole = token_chunk(rid, model, created, [self._ID], self._TEXT, None).decode()
        text_at = whole.index(json.dumps(self._TEXT))
        id_at = whole.index(f"[{self._ID}]")
        self.head = whole[:text_at]
        self.mid = whole[text_at + len(json.dumps(self._TEXT)) : id_at]
        self.tail = whole[id_at + len(f"[{self._ID}]") :]

    def render(self, ids: list[int], text: str) -> bytes:
        listed = ",".join(str(i) for i in ids)
        return f"{self.head}{_json_str(text)}{self.mid}[{listed}]{self.tail}".encode()


def usage_chunk(rid: str, model: str, created: int, prompt_tokens: int, tokens: int) -> bytes:
    usage = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + tokens,
        "completion_tokens": tokens,
        "prompt_tokens_details": None,
    }
    body = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Truth:
    """One request as the source served it (perf_counter seconds; due and send per chunk)."""

    serial: int
    key: str  # the X-Pdbench-Conversation header, "" if absent
    arrival_s: float
    due_s: list[float] = field(default_factory=list)
    send_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    done_s: float = 0.0
    aborted: bool = False


class TokenSource:
    def __init__(
        self,
        ttft_ms: float,
        itl_ms: float,
        model: str,
        vocab_size: int = 512,
        chunk_tokens: tuple[int, ...] = (1,),
    ):
        self.ttft_s = ttft_ms / 1e3
        self.itl_s = itl_ms / 1e3
        self.chunk_tokens = chunk_tokens
        self.model = model
        self.vocab_size = vocab_size
        self.serial = 0
        self.truth: list[Truth] = []
        self.sched_at_reset = sched_ms()

    async def completions(self, request):
        from aiohttp import web

        arrival = time.perf_counter()
        body = await request.json()
        if not body.get("stream"):
            msg = {"error": {"message": "the token source only streams"}}
            return web.json_response(msg, status=400)
        n = int(body.get("max_tokens") or 16)
        schedule = Schedule(self.ttft_s, self.itl_s, n)
        serial = self.serial
        self.serial += 1
        truth = Truth(serial, request.headers.get(CONVERSATION_HEADER, ""), arrival)
        self.truth.append(truth)
        ids = token_ids(serial, n, self.vocab_size)
        prompt = body.get("prompt")
        prompt_ids = prompt if isinstance(prompt, list) and body.get("return_token_ids") else None
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        rid, created = f"cmpl-src-{serial}", int(time.time())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            template = ChunkTemplate(rid, self.model, created)
            sizes = chunk_sizes(n, self.chunk_tokens)
            k = 0  # the chunk's first token
            for j, size in enumerate(sizes):
                part = ids[k : k + size]
                text = "".join(token_text(serial, i) for i in range(k, k + size))
                if 0 < j < len(sizes) - 1:
                    chunk = template.render(part, text)
                else:
                    finish = "length" if j == len(sizes) - 1 else None
                    first = prompt_ids if j == 0 else None
                    chunk = token_chunk(rid, self.model, created, part, text, finish, first)
                last = k + size - 1  # the chunk goes when its last token is due
                wait = schedule.wait_s(last, arrival, time.perf_counter())
                if wait > 0:
                    await asyncio.sleep(wait)
                truth.due_s.append(arrival + schedule.offset_s(last))
                truth.send_s.append(time.perf_counter())
                truth.chunk_tokens.append(size)
                truth.token_ids.extend(part)
                await response.write(chunk)
                k += size
            await response.write(usage_chunk(rid, self.model, created, prompt_tokens, n) + DONE)
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            truth.aborted = True
            raise
        truth.done_s = time.perf_counter()
        return response

    async def get_truth(self, request):
        from aiohttp import web

        return web.json_response(
            {
                "ttft_ms": self.ttft_s * 1e3,
                "itl_ms": self.itl_s * 1e3,
                "sched_since_reset": sched_delta(self.sched_at_reset, sched_ms()),
                "requests": [asdict(t) for t in self.truth],
            }
        )

    async def reset(self, request):
        from aiohttp import web

        data = await request.json() if request.can_read_body else {}
        if "ttft_ms" in data:
            self.ttft_s = float(data["ttft_ms"]) / 1e3
        if "itl_ms" in data:
            self.itl_s = float(data["itl_ms"]) / 1e3
        self.truth.clear()
        self.sched_at_reset = sched_ms()
        return web.json_response({"ttft_ms": self.ttft_s * 1e3, "itl_ms": self.itl_s * 1e3})

    async def models(self, request):
        from aiohttp import web

        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "root": self.model}]}
        )

    async def health(self, request):
        from aiohttp import web

        return web.Response(text="ok")

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/truth", self.get_truth)
        app.router.add_post("/reset", self.reset)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        return app


def parse_chunk_pattern(text: str) -> tuple[int, ...]:
    """``"1,3,2"`` -> (1, 3, 2); every count at least 1."""
    pattern = tuple(int(x) for x in text.split(","))
    chunk_sizes(1, pattern)  # raises on a zero or negative count
    return pattern


def main(argv: list[str] | None = None) -> None:
    from aiohttp import web

    parser = argparse.ArgumentParser(description="calibrated OpenAI-completions token source")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--model", default="token-source")
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument(
        "--chunk-tokens",
        type=parse_chunk_pattern,
        default=(1,),
        help="tokens per chunk, a comma-separated pattern repeated (default 1; e.g. 1,3,2)",
    )
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="uvloop", help="uvloop if installed"
    )
    args = parser.parse_args(argv)
    if args.host != "127.0.0.1":
        parser.error("the token source serves loopback only (--host 127.0.0.1)")
    loop_factory = None
    if args.loop == "uvloop":
        try:
            import uvloop

            loop_factory = uvloop.new_event_loop
        except ImportError:
            pass
    source = TokenSource(args.ttft_ms, args.itl_ms, args.model, args.vocab_size, args.chunk_tokens)
    kwargs = {"loop": loop_factory()} if loop_factory else {}
    web.run_app(
        source.app(),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        backlog=LISTEN_BACKLOG,
        **kwargs,
    )


if __name__ == "__main__":
    main()
