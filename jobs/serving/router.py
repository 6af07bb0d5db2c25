"""The P/D router: an OpenAI-completions proxy that implements pdbench's flows.

Runs as its own process (``python -m jobs.serving.router --config FILE``) so that its event loop
does not share time with the load generator. Per conversation turn (header
``X-Pdbench-Conversation``), by the flow set with ``POST /pdbench/flow``:

- ``agg``: forward to the agg instance.
- ``recompute``: P prefills the whole prompt (``max_tokens=1``, ``do_remote_decode``), D
  pulls it from P and streams the answer.
- ``pull``: from turn 2, P is handed D's ``kv_transfer_params`` of the conversation's last
  turn and pulls the history from D, computing only the new tokens; D pulls back from P.
- ``decode_first``: if the share of the prompt D already holds is at or above
  ``cache_hit_threshold``, D serves the turn alone; otherwise the fallback flow.

A conversation sticks to one P and one D. The route taken is returned in the response
header ``X-Pdbench-Path``. D's params come from the connector plugin in D's engine core over
HTTP (``connector.kv_params_service``; vLLM does not put them in streamed responses); a
conversation's next turn waits until the last one's params are in (or known missing).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from jobs.serving.router_headers import (
    CONVERSATION_HEADER,
    PATH_HEADER,
    PREFILL_MS_HEADER,
    REQUEST_ID_HEADER,
    ROUTER_SPANS_HEADER,
    TURN_HEADER,
    format_spans,
)
from pdbench.config.schema import Flow
from pdbench.plan.kv_lease import pull_window_s

FLOWS = tuple(f.value for f in Flow)


@dataclass
class RouterConfig:
    """The router's ``--config`` file. The settings come from the run's typed config
    (``flow``, ``server.router_port``, ``workload.request_timeout_s``), written by the one
    builder of launch artifacts: no defaults here that could drift from those."""

    prefill_urls: list[str]
    decode_urls: list[str]
    agg_urls: list[str]
    kv_params_urls: list[str]  # decode_urls[i]'s KV-params service (the plugin in D)
    host: str
    port: int
    cache_hit_threshold: float
    decode_first_fallback: str
    decoder_kv_blocks_ttl_s: float
    request_timeout_s: float
    flow: str = "agg"  # the flow served until the job sets one (POST /pdbench/flow)
    params_wait_s: float = 2.0  # how long D's plugin may take to have a turn's KV params


@dataclass
class ConversationState:
    """What the router knows of one conversation's KV on its D instance."""

    d_params: dict[str, Any] | None = None
    d_params_at: float = 0.0  # router monotonic time when D finished the last turn
    d_tokens: int = 0  # tokens whose KV D holds (last prompt + output - 1)
    turns: int = 0
    # Set once the last turn's params are in (or known missing); the next turn waits for it.
    settled: asyncio.Event | None = None


@dataclass
class RouterStats:
    paths: dict[str, int] = field(default_factory=dict)
    expired_leases: int = 0
    missing_params: int = 0  # turns whose D params never came: the next turn recomputes
    failed: int = 0
    retries: int = 0


@dataclass
class TurnTiming:
    """The router's clock (``time.perf_counter``) over one turn; 0: that step did not happen."""

    received: float  # the request arrived (before its body was read)
    p_sent: float = 0.0
    p_answered: float = 0.0
    d_sent: float = 0.0  # the request to D (agg: to the serving instance) was sent
    d_first: float = 0.0  # D's first chunk arrived

    def spans_ms(self) -> dict[str, float]:
        """``route``: received -> first upstream send; ``p``: P's answer; ``gap``: P answered ->
        D sent; ``d``: D sent -> D's first chunk (``ROUTER_SPANS_HEADER``)."""
        first_send = self.p_sent or self.d_sent
        p = self.p_answered - self.p_sent if self.p_sent else 0.0
        gap = self.d_sent - self.p_answered if self.p_sent else 0.0
        return {
            "route": (first_send - self.received) * 1e3,
            "p": p * 1e3,
            "gap": gap * 1e3,
            "d": (self.d_first - self.d_sent) * 1e3,
        }


def pick(urls: list[str], conversation: str) -> str:
    """Conversation affinity: a stable hash of the conversation id picks the instance."""
    return urls[zlib.crc32(conversation.encode()) % len(urls)]


def prefill_body(body: dict[str, Any], kv_params: dict[str, Any]) -> dict[str, Any]:
    """P's request: the same prompt, one token, no streaming, KV kept for D."""
    out = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "min_tokens")}
    out.update(stream=False, max_tokens=1, kv_transfer_params=kv_params)
    return out


P_FIRST_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
D_ALONE_PARAMS = {"do_remote_decode": False, "do_remote_prefill": False}


def held_share(state: ConversationState, prompt_tokens: int) -> float:
    """The share of this prompt whose KV the conversation's D holds."""
    if prompt_tokens <= 0:
        return 0.0
    return min(state.d_tokens, prompt_tokens) / prompt_tokens


class Router:
    def __init__(self, config: RouterConfig):
        self.config = config
        self.conversations: dict[str, ConversationState] = {}
        self.stats = RouterStats()
        self.tag = "x"
        self.session = None

    # ---- routing decisions (pure given state) ----
    def lease_valid(self, state: ConversationState, now: float) -> bool:
        """D still holds the blocks when P reads them: P declines a read close to D's expiry
        (and that request then stalled here), so the lease must leave P a window
        (``pdbench.plan.kv_lease``)."""
        return now - state.d_params_at < pull_window_s(self.config.decoder_kv_blocks_ttl_s)

    def choose_route(self, flow: str, state: ConversationState, prompt_tokens: int, now: float):
        """Returns (path, p_params or None, d_alone)."""
        if flow == "agg":
            return "agg", None, False
        if flow == "decode_first":
            if (
                state.d_tokens
                and held_share(state, prompt_tokens) >= self.config.cache_hit_threshold
            ):
                if self.lease_valid(state, now):
                    return "decode_first", None, True
            flow = self.config.decode_first_fallback
        if flow == "pull" and state.d_params is not None:
            if self.lease_valid(state, now):
                return "pull", dict(state.d_params), False
            self.stats.expired_leases += 1
            return "recompute_expired", dict(P_FIRST_PARAMS), False
        return "recompute", dict(P_FIRST_PARAMS), False

    # ---- HTTP ----
    async def handle_completions(self, request):
        received = time.perf_counter()
        raw = await request.read()
        body = _loads(raw)
        conversation = request.headers.get(CONVERSATION_HEADER, uuid.uuid4().hex)
        state = self.conversations.setdefault(conversation, ConversationState())
        if state.settled is not None:  # the last turn's params first (bounded: see _remember_d)
            await state.settled.wait()
        prompt = body.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else 0
        flow = self.config.flow
        path, p_params, d_alone = self.choose_route(flow, state, prompt_tokens, time.monotonic())
        self.stats.paths[path] = self.stats.paths.get(path, 0) + 1
        # Request ids name the Point (tag) and turn, so per-transfer traces map back to them.
        turn = request.headers.get(TURN_HEADER, "0")
        rid = f"pdb-{self.tag}-t{turn}-{uuid.uuid4().hex[:12]}"
        # The next turn of this conversation waits until this one's D params are settled.
        settled = None
        if flow in ("pull", "decode_first") and path != "agg":
            settled = state.settled = asyncio.Event()
        try:
            route = (path, p_params, d_alone)
            timing = TurnTiming(received)
            return await self._route(
                request, state, conversation, route, body, raw, rid, settled, timing
            )
        finally:
            if settled is not None:
                settled.set()
                if state.settled is settled:
                    state.settled = None

    async def _route(self, request, state, conversation, route, body, raw, rid, settled, timing):
        """Send one turn along ``route`` (path, P's params, D alone), its spans in ``timing``;
        remember D's params when ``settled`` (a pull or decode-first turn)."""
        path, p_params, d_alone = route
        c = self.config
        extra = {REQUEST_ID_HEADER: rid}
        try:
            if path == "agg":
                target = pick(c.agg_urls or c.decode_urls, conversation)
                return await self._relay(request, target, body, rid, path, raw, extra, timing)
            d_url = pick(c.decode_urls, conversation)
            if d_alone:
                d_body = dict(body, kv_transfer_params=dict(D_ALONE_PARAMS))
            else:
                p_url = pick(c.prefill_urls, conversation)
                timing.p_sent = time.perf_counter()
                p_resp = await self._post_json(p_url, prefill_body(body, p_params), f"{rid}-p")
                timing.p_answered = time.perf_counter()
                extra[PREFILL_MS_HEADER] = f"{(timing.p_answered - timing.p_sent) * 1e3:.3f}"
                d_body = dict(body, kv_transfer_params=p_resp.get("kv_transfer_params"))
            response = await self._relay(
                request, d_url, d_body, f"{rid}-d", path, None, extra, timing
            )
        except Exception as exc:  # upstream failure: a clear error, never a silent drop
            self.stats.failed += 1
            return web.json_response(
                {"error": {"message": f"router ({path}): {type(exc).__name__}: {exc}"}},
                status=502,
                headers={PATH_HEADER: path},
            )
        if settled is not None and response.status == 200:
            await self._remember_d(state, d_url, f"{rid}-d")
        state.turns += 1
        return response

    async def _remember_d(self, state: ConversationState, d_url: str, d_rid: str) -> None:
        params = await self._fetch_params(d_url, d_rid)
        if params is None:
            self.stats.missing_params += 1
            state.d_params, state.d_tokens = None, 0
            return
        state.d_params = params
        state.d_params_at = time.monotonic()
        state.d_tokens = int(params.get("remote_num_tokens") or 0)

    async def _fetch_params(self, d_url: str, d_rid: str) -> dict[str, Any] | None:
        """D's params of request ``d_rid`` from its plugin (``connector.kv_params_service``),
        or None when they do not come within ``params_wait_s``."""
        c = self.config
        url = c.kv_params_urls[c.decode_urls.index(d_url)]
        wait_s = c.params_wait_s
        timeout = aiohttp.ClientTimeout(total=wait_s + 5.0)
        try:
            async with self.session.get(
                f"{url}/kv_params/{d_rid}", params={"wait_s": str(wait_s)}, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    return None
                return _loads(await resp.read())
        except (TimeoutError, aiohttp.ClientError):
            return None

    async def _send(self, url: str, body: dict[str, Any], rid: str, raw: bytes | None = None):
        """POST to an instance (``raw``: the body's JSON bytes, sent as they are). A keep-alive
        connection the server closed meanwhile fails before the request reaches it; only that
        is retried (once, with a little jitter): nothing was generated yet, so it is safe."""

        data = raw if raw is not None else _dumps(body)
        headers = {"X-Request-Id": rid, "Content-Type": "application/json"}
        for attempt in (1, 2):
            try:
                return await self.session.post(f"{url}/v1/completions", data=data, headers=headers)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if attempt == 2:
                    raise
                self.stats.retries += 1
                await asyncio.sleep(random.uniform(0.001, 0.01))
        raise AssertionError("unreachable")

    async def _post_json(self, url: str, body: dict[str, Any], rid: str) -> dict[str, Any]:
        async with await self._send(url, body, rid) as resp:
            data = await resp.json(content_type=None)
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}: {data}")
            return data

    async def _relay(
        self,
        request,
        url: str,
        body: dict[str, Any],
        rid: str,
        path: str,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        timing: TurnTiming | None = None,
    ):
        """Forward to ``url`` and pass its answer through, streamed when the client streams.
        A stream's headers go out with its first chunk, so that they can carry the router's
        spans up to that chunk (``ROUTER_SPANS_HEADER``)."""

        headers = {PATH_HEADER: path, **(headers or {})}
        timing = timing or TurnTiming(time.perf_counter())
        timing.d_sent = time.perf_counter()
        async with await self._send(url, body, rid, raw) as upstream:
            if upstream.status != 200 or not body.get("stream"):
                payload = await upstream.read()
                timing.d_first = time.perf_counter()
                headers[ROUTER_SPANS_HEADER] = format_spans(timing.spans_ms())
                return web.Response(
                    body=payload,
                    status=upstream.status,
                    content_type="application/json",
                    headers=headers,
                )
            chunks = upstream.content.iter_any()
            first = await anext(chunks, b"")
            timing.d_first = time.perf_counter()
            headers[ROUTER_SPANS_HEADER] = format_spans(timing.spans_ms())
            response = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream", **headers}
            )
            await response.prepare(request)
            await response.write(first)
            async for chunk in chunks:
                await response.write(chunk)
            await response.write_eof()
            return response

    async def handle_flow(self, request):

        data = await request.json()
        flow = data.get("flow")
        if flow not in FLOWS:
            return web.json_response({"error": f"flow={flow!r}: use one of {FLOWS}"}, status=400)
        self.config.flow = flow
        self.tag = str(data.get("tag") or "x")
        self.conversations.clear()
        self.stats = RouterStats()
        return web.json_response({"flow": flow})

    async def handle_stats(self, request):

        s = self.stats
        return web.json_response(
            {
                "flow": self.config.flow,
                "paths": s.paths,
                "expired_leases": s.expired_leases,
                "missing_params": s.missing_params,
                "failed": s.failed,
                "retries": s.retries,
            }
        )

    async def handle_health(self, request):

        return web.Response(text="ok")

    def app(self):

        async def on_startup(app):
            timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
            # Shorter than uvicorn's 5 s keep-alive, so that idle connections close here first.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)
            self.session = aiohttp.ClientSession(timeout=timeout, connector=connector)

        async def on_cleanup(app):
            await self.session.close()

        app = web.Application(client_max_size=64 * 1024**2)
        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        app.router.add_post("/v1/completions", self.handle_completions)
        app.router.add_post("/pdbench/flow", self.handle_flow)
        app.router.add_get("/pdbench/stats", self.handle_stats)
        app.router.add_get("/health", self.handle_health)
        return app


def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(description="pdbench P/D router")
    parser.add_argument("--config", required=True, help="JSON file with RouterConfig fields")
    args = parser.parse_args(argv)
    config = RouterConfig(**json.loads(Path(args.config).read_text()))
    # backlog: aiohttp's default accept queue (128) overflows when more clients connect at
    # once; the kernel then drops SYNs and the client retries after 1 s, 3 s, ...
    web.run_app(
        Router(config).app(),
        host=config.host,
        port=config.port,
        print=None,
        loop=_new_loop(),
        backlog=2048,
    )


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when installed (a vLLM dependency): per relayed chunk it costs about half of
    asyncio's loop; the router's delay is added to every token the client times."""
    try:
        import uvloop  # lazy: optional: a faster loop when installed
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _loads(raw: bytes) -> Any:
    """JSON to Python objects; msgspec when installed (a 16k-id prompt: 0.4 ms, not 0.9)."""
    try:
        import msgspec  # lazy: optional: faster JSON when installed
    except ImportError:
        return json.loads(raw)
    return msgspec.json.decode(raw)


def _dumps(body: Any) -> bytes:
    try:
        import msgspec  # lazy: optional: faster JSON when installed
    except ImportError:
        return json.dumps(body).encode()
    return msgspec.json.encode(body)


if __name__ == "__main__":
    main()
