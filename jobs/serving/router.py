"""The P/D router: an OpenAI-API proxy that implements pdbench's flows.

Runs as its own process (``python -m jobs.serving.router --config FILE``) so that its event loop
does not share time with the load generator. It serves what clients use:
``/v1/chat/completions`` and ``/v1/completions`` (text or token ids, streamed or not),
``/v1/models``, ``/tokenize``, ``/detokenize``, ``/health``, ``/metrics`` (Prometheus:
``jobs.serving.router_metrics``); P and D always get token-id
completions (``jobs.serving.openai_api``: why). A conversation is named by ``X-Session-ID``,
``X-Pdbench-Conversation`` or a ``conversation_id`` body field (``jobs.serving.sessions``);
a request naming none stands alone. Per turn, by the flow set with ``POST /pdbench/flow``:

- ``agg``: forward to the agg instance.
- ``recompute``: P prefills the whole prompt (``max_tokens=1``, ``do_remote_decode``), D
  pulls it from P and streams the answer.
- ``pull``: from turn 2, P is handed D's ``kv_transfer_params`` of the conversation's last
  turn and pulls the history from D, computing only the new tokens; D pulls back from P.
  Only onto a true prefix: when the prompt does not begin with exactly the tokens D holds
  (a client edited the history), P recomputes (``recompute_diverged``).
- ``decode_first``: if the share of the prompt D already holds is at or above
  ``cache_hit_threshold``, D serves the turn alone; otherwise the fallback flow.
- ``policy``: as ``pull`` where the turn could pull (same guards), but the rule of the
  deployment's ``policy.json`` entry (``pdbench.results.policy_rule``) decides per turn
  whether P pulls or recomputes (``recompute_policy``), from the history D holds and the
  turns in flight at the conversation's P (this one included: the router's own count).
- ``static_light``, ``static_heavy``: the same, by the entry's threshold of its lightest
  (heaviest) measured load at every load: the static rules the policy is checked against.

A conversation sticks to one P and one D. The route taken is returned in the response
header ``X-Pdbench-Path`` and written, with the tokens and spans of the turn, to the
request log (``jobs.serving.request_log``). D's params come from the connector plugin in
D's engine core over HTTP (``connector.plugin.kv_params_service``; vLLM does not put them in
streamed responses); a conversation's next turn waits until the last one's params are in
(or known missing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from connector.plugin.kv_params_service import OUTPUT_IDS_KEY
from connector.plugin.no_lease import NO_LEASE_KEY
from connector.process_env import API_KEY_ENV
from jobs.serving import openai_api
from jobs.serving.openai_api import CHAT, COMPLETIONS, ChatStream, CompletionStream
from jobs.serving.request_log import RequestLog, TurnLog
from jobs.serving.router_headers import (
    CLIENT_REQUEST_ID_HEADER,
    PATH_HEADER,
    PREFILL_MS_HEADER,
    REQUEST_ID_HEADER,
    ROUTER_SPANS_HEADER,
    TURN_HEADER,
    format_spans,
)
from jobs.serving.router_metrics import RouterMetrics
from jobs.serving.router_policy import load_policy
from jobs.serving.routing import (
    D_ALONE_PARAMS,
    PULL_FLOWS,
    RULE_FLOWS,
    RoutePolicy,
    RouterStats,
    pick,
    prefill_body,
)
from jobs.serving.sessions import (
    RECOGNISED,
    SESSION_BODY_KEY,
    Conversations,
    ConversationState,
    held_tokens,
    session_of,
)
from pdbench.config.schema import Flow

FLOWS = tuple(f.value for f in Flow)
IDLE_MARGIN_S = 60.0  # a conversation idle this long past D's TTL is forgotten
CLIENT_CHECK_S = 0.05  # how often a prefill in progress checks that its client is still there


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
    request_log: str = ""  # where each request's TurnLog line goes ("": nowhere)
    bidirectional: bool = True  # D keeps its KV for P (pull and decode_first need it)
    # flow policy: the policy.json, what its entry must match (PolicyTarget's fields) and
    # whether a mismatched entry runs anyway (pdbench.validate.policy checked it before)
    policy: str = ""
    policy_target: dict[str, Any] | None = None
    policy_force: bool = False
    # a request that names no conversation: found by the tokens D holds (sessions.py)
    match_prefix: bool = True
    # what requests are checked against before P works on them (""/0: not checked)
    model: str = ""
    max_model_len: int = 0


@dataclass
class TurnTiming:
    """The router's clock (``time.perf_counter``) over one turn; 0: that step did not happen."""

    received: float  # the request arrived (before its body was read)
    p_sent: float = 0.0
    p_answered: float = 0.0
    d_sent: float = 0.0  # the request to D (agg: to the serving instance) was sent
    d_first: float = 0.0  # D's first chunk arrived
    d_last: float = 0.0  # D's answer ended
    chunks: int = 0  # streamed events of the answer that went to the client ([DONE] not)
    output_tokens: int = -1  # the answer's usage.completion_tokens (-1: it had none)

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


STREAM_END = b"data: [DONE]\n\n"  # the last event of an OpenAI stream


@dataclass
class Turn:
    """One turn on its way: what routing it needs besides the request."""

    api: str
    flow: str
    state: ConversationState
    session: str  # "" when the request named no conversation
    conversation: str  # the affinity key
    prompt: list[int]
    upstream: dict[str, Any]  # the completion request P and D get
    raw: bytes | None  # its JSON as the client sent it, when unchanged
    rid: str
    p_url: str  # its P ("" without one)


class UpstreamError(Exception):
    """An instance answered a request with an error status (its body: vLLM's error JSON)."""

    def __init__(self, role: str, status: int, body: bytes):
        super().__init__(f"{role} answered {status}")
        self.role, self.status, self.body = role, status, body


class ClientGone(Exception):
    """The client's connection broke while its answer was being written."""


class StreamCut(Exception):
    """An upstream stream that broke after its first chunk went to the client."""

    def __init__(self, response, cause: BaseException):
        super().__init__(str(cause))
        self.response = response  # the answer already under way (prepared, cut off)
        self.cause = cause


class Router:
    def __init__(self, config: RouterConfig):
        self.config = config
        self.conversations = Conversations(config.decoder_kv_blocks_ttl_s + IDLE_MARGIN_S)
        self.loaded_policy = load_policy(config.policy, config.policy_target, config.policy_force)
        self.policy = RoutePolicy(
            config.cache_hit_threshold,
            config.decode_first_fallback,
            config.decoder_kv_blocks_ttl_s,
            self.loaded_policy.rules if self.loaded_policy else None,
        )
        self.in_flight: dict[str, int] = {}  # P url -> turns in flight of its conversations
        self.metrics = RouterMetrics(self.in_flight, config.prefill_urls)
        self.tag = "x"
        self.session = None
        self.log = RequestLog(config.request_log)

    @property
    def stats(self) -> RouterStats:
        return self.policy.stats

    # ---- HTTP ----
    async def handle_completions(self, request):
        return await self._serve(request, COMPLETIONS)

    async def handle_chat(self, request):
        return await self._serve(request, CHAT)

    async def _serve(self, request, api: str):
        """One client request: checked, tokenized, routed and logged (every answer, a refusal
        too, is a line of the request log)."""
        timing = TurnTiming(time.perf_counter())
        log = TurnLog(
            request_id=f"pdb-{self.tag}-t0-{uuid.uuid4().hex[:12]}",
            session="",
            api=api,
            flow=self.config.flow,
            client_request_id=request.headers.get(CLIENT_REQUEST_ID_HEADER, ""),
        )
        try:
            return await self._checked(request, api, log, timing)
        except asyncio.CancelledError:  # a server that cancels the handler of a client gone
            self.stats.cancelled += 1
            log.status, log.error = 499, "client disconnected: the request was cancelled"
            self.log.write(log)
            self.metrics.observe(log.path, 499, -1.0, 0, 0.0)
            raise

    async def _checked(self, request, api: str, log: TurnLog, timing: TurnTiming):
        raw = await request.read()
        try:
            body = _loads(raw)
        except ValueError as exc:
            return self._refused(log, 400, f"the body is not JSON: {exc}", timing)
        if not isinstance(body, dict):
            return self._refused(log, 400, "the body is not a JSON object", timing)
        problem = openai_api.unsupported(body, api)
        if problem:
            return self._refused(log, 400, problem, timing)
        missing = openai_api.model_problem(body, self.config.model)
        if missing:
            return self._refused(log, 404, missing, timing)
        session = session_of(request.headers, body)
        # tokenizing is alike on every serving instance: the conversation's own, when named
        served_by = self.config.agg_urls if self.config.flow == "agg" else []
        answering = pick(served_by or self.config.decode_urls or self.config.agg_urls, session)
        if openai_api.needs_tokens(body, api):
            tokens = await self._tokenize(answering, openai_api.tokenize_request(body, api))
            if isinstance(tokens, web.Response):
                return self._logged(log, tokens, timing)
            upstream, raw = openai_api.completion_request(body, api, tokens), None
        else:
            upstream = body
            if SESSION_BODY_KEY in body:  # the session's field stays here
                upstream = {k: v for k, v in body.items() if k != SESSION_BODY_KEY}
                raw = None
        prompt = upstream["prompt"]
        log.prompt_tokens = len(prompt)
        log.matched = "header" if session else ""
        if not session and self.config.match_prefix:
            session = self.conversations.recognise(prompt)
            before = None if session else self.conversations.in_flight_before(prompt)
            if before is not None:  # its last turn has not settled yet: then matched
                await before.wait()
                session = self.conversations.recognise(prompt)
            log.matched = "prefix" if session else ""
            session = session or f"{RECOGNISED}{uuid.uuid4().hex[:16]}"
        state = self.conversations.get(session, time.monotonic())
        conversation = session or uuid.uuid4().hex  # the affinity key
        # Request ids name the Point (tag) and turn, so per-transfer traces map back to them.
        turn = request.headers.get(TURN_HEADER, "")
        turn = int(turn) if turn.isdigit() else (state.turns + 1 if session else 0)
        rid = f"pdb-{self.tag}-t{turn}-{uuid.uuid4().hex[:12]}"
        flow = self.config.flow
        log.request_id, log.session, log.turn = rid, session, turn
        too_long = openai_api.length_problem(body, len(prompt), self.config.max_model_len)
        if too_long:  # before P spends a prefill on it
            return self._refused(log, 400, too_long, timing)
        if state.settled is not None:  # the last turn's params first (bounded: see _remember_d)
            await state.settled.wait()
        p_url = pick(self.config.prefill_urls, conversation) if self.config.prefill_urls else ""
        self.in_flight[p_url] = self.in_flight.get(p_url, 0) + 1
        turn_of = Turn(api, flow, state, session, conversation, prompt, upstream, raw, rid, p_url)
        try:
            return await self._serve_turn(request, turn_of, log, timing)
        finally:
            self.in_flight[p_url] -= 1

    def _refused(self, log: TurnLog, status: int, message: str, timing: TurnTiming):
        """The client's request is wrong: answered as vLLM would, logged, counted apart."""
        self.stats.refused += 1
        log.error = message
        return self._logged(log, _error(status, message), timing)

    async def _serve_turn(self, request, t: Turn, log: TurnLog, timing: TurnTiming):
        """Route one turn (``t.p_url``: its P, whose turns in flight are the policy's load)."""
        state = t.state
        log.load_in_flight = self.in_flight.get(t.p_url, 0)
        route = self.policy.choose(t.flow, state, t.prompt, time.monotonic(), log.load_in_flight)
        self.stats.paths[route.path] = self.stats.paths.get(route.path, 0) + 1
        log.path, log.diverged_at, log.offered_tokens = route.path, route.diverged_at, route.offered
        if route.decision is not None:
            log.decision = route.decision.record()
        if state.d_params is not None and route.diverged_at < 0:
            log.held_tokens = min(state.d_tokens, len(t.prompt))
        # The next turn of this conversation waits until this one's D params are settled.
        settled = None
        if t.session and t.flow in PULL_FLOWS and route.path != "agg":
            settled = state.settled = asyncio.Event()
            state.asking = t.prompt
        try:
            response = await self._route(
                request,
                state,
                t.conversation,
                route,
                t.upstream,
                t.raw,
                t.rid,
                settled,
                timing,
                t.api,
                log,
            )
            return self._logged(log, response, timing)
        finally:
            if settled is not None:
                settled.set()
                if state.settled is settled:
                    state.settled, state.asking = None, []

    def _logged(self, log: TurnLog, response, timing: TurnTiming):
        """Write the turn's log line (status, spans) and return ``response``, which carries
        the client's ``X-Request-ID`` back."""
        # a stream cut after it began went out as 200: the log says what the client got
        log.status = response.status
        if log.error.startswith("stream cut"):
            log.status = 502
        elif log.error.startswith("client disconnected"):
            log.status = 499
        if log.client_request_id and not response.prepared:
            response.headers[CLIENT_REQUEST_ID_HEADER] = log.client_request_id
        if log.status == 200:  # what a replay of this session sends back (recorded.py)
            log.output_tokens = timing.output_tokens if timing.output_tokens >= 0 else timing.chunks
        if timing.d_sent:
            log.spans_ms = timing.spans_ms()
            log.spans_ms["last"] = ((timing.d_last or time.perf_counter()) - timing.d_sent) * 1e3
        self.log.write(log)
        began = timing.d_first - timing.received if timing.d_first else -1.0
        self.metrics.observe(
            log.path, log.status, began, timing.chunks, timing.d_last - timing.d_first
        )
        return response

    async def _tokenize(self, url: str, body: dict[str, Any]) -> list[int] | web.Response:
        """The prompt ids the serving instance's own ``/tokenize`` gives (its chat template
        and tokenizer), or its error as the answer to the client."""
        try:
            headers = {"Content-Type": "application/json"}
            async with self.session.post(
                f"{url}/tokenize", data=_dumps(body), headers=headers
            ) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    return web.Response(
                        body=payload, status=resp.status, content_type="application/json"
                    )
                return list(_loads(payload)["tokens"])
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.stats.failed += 1
            return _error(502, f"the serving instance did not tokenize ({type(exc).__name__})")

    async def _route(
        self, request, state, conversation, route, body, raw, rid, settled, timing, api, log
    ):
        """Send one turn along ``route``, its spans in ``timing``; remember D's params when
        ``settled`` (a pull or decode-first turn)."""
        path = route.path
        c = self.config
        extra = {REQUEST_ID_HEADER: rid}
        if log.client_request_id:  # streamed answers carry it from their first chunk
            extra[CLIENT_REQUEST_ID_HEADER] = log.client_request_id
        try:
            if path == "agg":
                target = pick(c.agg_urls or c.decode_urls, conversation)
                return await self._relay(request, target, body, rid, path, raw, extra, timing, api)
            d_url = pick(c.decode_urls, conversation)
            if route.d_alone:
                d_body = dict(body, kv_transfer_params=dict(D_ALONE_PARAMS))
            else:
                p_url = pick(c.prefill_urls, conversation)
                timing.p_sent = time.perf_counter()
                p_resp = await self._unless_client_left(
                    request, self._post_json(p_url, prefill_body(body, route.p_params), f"{rid}-p")
                )
                timing.p_answered = time.perf_counter()
                extra[PREFILL_MS_HEADER] = f"{(timing.p_answered - timing.p_sent) * 1e3:.3f}"
                log.p_cached_tokens = _cached_tokens(p_resp)
                d_body = dict(body, kv_transfer_params=p_resp.get("kv_transfer_params"))
            if settled is None and d_body["kv_transfer_params"]:  # no next turn: no lease
                d_body["kv_transfer_params"] = {**d_body["kv_transfer_params"], NO_LEASE_KEY: True}
            response = await self._relay(
                request, d_url, d_body, f"{rid}-d", path, None, extra, timing, api
            )
        except ClientGone as gone:  # before the answer began: P's request was closed
            self.stats.cancelled += 1
            log.error = f"client disconnected: {gone}"
            return _error(499, "client disconnected", {PATH_HEADER: path})
        except StreamCut as cut:  # the stream broke after it began
            if isinstance(cut.cause, ClientGone):  # the client left: nothing failed here
                self.stats.cancelled += 1
                log.error = f"client disconnected: {cut.cause}"
            else:  # upstream broke: the client was cut off
                self.stats.failed += 1
                log.error = f"stream cut: {type(cut.cause).__name__}: {cut.cause}"
            return cut.response
        except UpstreamError as exc:
            log.error = f"{exc}: {exc.body[:500].decode(errors='replace')}"
            if 400 <= exc.status < 500:  # the request was wrong: vLLM's own answer
                self.stats.refused += 1
                return web.Response(
                    body=exc.body,
                    status=exc.status,
                    content_type="application/json",
                    headers={PATH_HEADER: path},
                )
            self.stats.failed += 1
            return _error(
                502, f"the {exc.role} instance failed (HTTP {exc.status})", {PATH_HEADER: path}
            )
        except Exception as exc:  # upstream failure: a clear error, never a silent drop
            self.stats.failed += 1
            log.error = f"{type(exc).__name__}: {exc}"  # the log has the instance's address
            return _error(
                502,
                f"a serving instance failed on this request ({type(exc).__name__})",
                {PATH_HEADER: path},
            )
        if settled is not None and response.status == 200:
            await self._remember_d(state, d_url, f"{rid}-d", body["prompt"])
            self.conversations.index(conversation, state)
        state.turns += 1
        return response

    async def _unless_client_left(self, request, work):
        """``work``'s result, unless the client's connection closes first: then ``work`` is
        cancelled (its request to the instance closes, and vLLM aborts a request whose
        client closed) and ``ClientGone`` raised. Checked every ``CLIENT_CHECK_S``."""
        task = asyncio.ensure_future(work)
        while True:
            try:
                done, _ = await asyncio.wait({task}, timeout=CLIENT_CHECK_S)
            except asyncio.CancelledError:  # a server that cancels handlers did: P's too
                task.cancel()
                raise
            if done:
                return task.result()
            transport = request.transport
            if transport is None or transport.is_closing():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                raise ClientGone("the client left while P prefilled its prompt")

    async def _remember_d(
        self, state: ConversationState, d_url: str, d_rid: str, prompt: list[int]
    ) -> None:
        params = await self._fetch_params(d_url, d_rid)
        outputs = params.pop(OUTPUT_IDS_KEY, None) if params is not None else None
        if params is None or outputs is None:  # without D's tokens nothing can be checked
            self.stats.missing_params += 1
            state.forget_d()
            return
        state.d_params = params
        state.d_params_at = time.monotonic()
        state.held = held_tokens(prompt, outputs, int(params.get("remote_num_tokens") or 0))

    async def _fetch_params(self, d_url: str, d_rid: str) -> dict[str, Any] | None:
        """D's params of request ``d_rid`` from its plugin (``connector.plugin.kv_params_service``),
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
            payload = await resp.read()
            if resp.status != 200:
                raise UpstreamError("prefill", resp.status, payload)
            return _loads(payload)

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
        api: str = COMPLETIONS,
    ):
        """Forward to ``url`` and pass its answer through (as chat for a chat request),
        streamed when the client streams. A stream's headers go out with its first chunk,
        so that they can carry the router's spans up to that chunk (``ROUTER_SPANS_HEADER``)."""

        headers = {PATH_HEADER: path, **(headers or {})}
        timing = timing or TurnTiming(time.perf_counter())
        # a streamed answer's length from D's usage (chunks undercount it: vLLM sends none
        # for a token with no text, and merges tokens when it is behind), not shown to a
        # client that asked none
        hide_usage = bool(body.get("stream")) and not openai_api.asks_usage(body)
        if hide_usage:
            body, raw = openai_api.with_usage(body), None
        timing.d_sent = time.perf_counter()
        async with await self._send(url, body, rid, raw) as upstream:
            if upstream.status != 200 or not body.get("stream"):
                payload = await upstream.read()
                timing.d_first = timing.d_last = time.perf_counter()
                headers[ROUTER_SPANS_HEADER] = format_spans(timing.spans_ms())
                if upstream.status == 200:
                    timing.output_tokens = openai_api.completion_tokens(payload)
                if api == CHAT and upstream.status == 200:
                    payload = _dumps(openai_api.chat_response(_loads(payload), rid))
                elif upstream.status == 200 and b"kv_transfer_params" in payload:
                    payload = _dumps(openai_api.without_internals(_loads(payload)))
                timing.chunks = 1
                return web.Response(
                    body=payload,
                    status=upstream.status,
                    content_type="application/json",
                    headers=headers,
                )
            stream = (
                ChatStream(rid, _loads, _dumps, hide_usage)
                if api == CHAT
                else CompletionStream(_loads, _dumps, hide_usage)
            )
            chunks = upstream.content.iter_any()
            first = await anext(chunks, b"")
            timing.d_first = time.perf_counter()
            headers[ROUTER_SPANS_HEADER] = format_spans(timing.spans_ms())
            response = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream", **headers}
            )
            await response.prepare(request)
            tail = b""  # the last bytes the client got: has it the stream's end?

            async def send(out: bytes) -> None:
                timing.chunks += out.count(b"data:") - out.count(b"data: [DONE]")
                try:
                    await response.write(out)
                except ConnectionError as exc:  # aiohttp's ClientConnectionResetError too
                    raise ClientGone(f"{type(exc).__name__}: {exc}") from exc

            try:
                out = stream.feed(first)
                await send(out)
                tail = (tail + out)[-len(STREAM_END) :]
                async for chunk in chunks:
                    out = stream.feed(chunk)
                    if out:
                        await send(out)
                        tail = (tail + out)[-len(STREAM_END) :]
            except Exception as exc:
                if tail != STREAM_END:
                    # The answer is under way: no error answer can follow it. Cut the
                    # client's connection so that it fails now, not at its own timeout (it
                    # waited 120 s for a stream whose D had died).
                    if request.transport is not None:
                        request.transport.close()
                    raise StreamCut(response, exc) from exc
                # else: the client had the whole answer and closed first (the OpenAI SDK
                # does once it reads [DONE]): a turn served, not a cut
            timing.d_last = time.perf_counter()
            timing.output_tokens = stream.completion_tokens
            with contextlib.suppress(ConnectionError):
                await response.write_eof()
            return response

    async def _forward_get(self, request, path: str):
        """A GET the serving instances answer alike (``/v1/models``), passed through."""
        url = (self.config.agg_urls or self.config.decode_urls)[0]
        async with self.session.get(f"{url}{path}") as resp:
            payload = await resp.read()
            return web.Response(body=payload, status=resp.status, content_type="application/json")

    async def _forward_post(self, request, path: str):
        """A POST the serving instances answer alike (``/tokenize``), passed through."""
        url = (self.config.agg_urls or self.config.decode_urls)[0]
        data = await request.read()
        headers = {"Content-Type": "application/json"}
        async with self.session.post(f"{url}{path}", data=data, headers=headers) as resp:
            payload = await resp.read()
            return web.Response(body=payload, status=resp.status, content_type="application/json")

    async def handle_models(self, request):
        return await self._forward_get(request, "/v1/models")

    async def handle_tokenize(self, request):
        return await self._forward_post(request, "/tokenize")

    async def handle_detokenize(self, request):
        return await self._forward_post(request, "/detokenize")

    async def handle_flow(self, request):
        try:
            data = _loads(await request.read())
        except ValueError as exc:
            return web.json_response({"error": f"the body is not JSON: {exc}"}, status=400)
        if not isinstance(data, dict):
            return web.json_response(
                {"error": 'the body must be a JSON object: {"flow": NAME, "tag": TEXT}'},
                status=400,
            )
        flow = data.get("flow")
        problem = self.flow_problem(flow)
        if problem:
            return web.json_response({"error": problem}, status=400)
        self.config.flow = flow
        self.tag = str(data.get("tag") or "x")
        self.conversations.clear()
        self.policy.stats = RouterStats()
        return web.json_response({"flow": flow})

    def flow_problem(self, flow: Any) -> str:
        """Why this deployment cannot serve ``flow`` ("" when it can)."""
        c = self.config
        if flow not in FLOWS:
            return f"flow={flow!r}: use one of {FLOWS}"
        if flow != "agg" and not (c.prefill_urls and c.decode_urls):
            return f"flow={flow}: this deployment has no prefill and decode instances"
        if flow in PULL_FLOWS and not c.bidirectional:
            return (
                f"flow={flow}: D does not keep its KV for P on this deployment (it was "
                f"started without any of {PULL_FLOWS} among its flows)"
            )
        if flow in RULE_FLOWS:
            if self.loaded_policy is None:
                return f"flow={flow}: the router was started without a policy (flow.policy=PATH)"
            problem = self.loaded_policy.rules[flow].problem
            if problem:
                return f"flow={flow}: the policy cannot decide: {problem}"
        return ""

    async def handle_stats(self, request):

        s = self.policy.stats
        return web.json_response(
            {
                "flow": self.config.flow,
                "paths": s.paths,
                "expired_leases": s.expired_leases,
                "diverged": s.diverged,
                "missing_params": s.missing_params,
                "failed": s.failed,
                "retries": s.retries,
                "refused": s.refused,
                "cancelled": s.cancelled,
                "conversations": len(self.conversations),
                "policy": self.loaded_policy.describe() if self.loaded_policy else None,
            }
        )

    async def handle_metrics(self, request):
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_health(self, request):

        return web.Response(text="ok")

    def app(self):
        key = os.environ.get(API_KEY_ENV, "")

        @web.middleware
        async def require_key(request, handler):
            """Every endpoint but /health (what a liveness probe asks) wants the key."""
            if key and request.path != "/health" and not _authorised(request, key):
                self.metrics.observe("", 401, -1.0, 0, 0.0)
                return _error(
                    401,
                    f"Unauthorized: give the router's key ({API_KEY_ENV}) as "
                    "'Authorization: Bearer <key>'",
                )
            return await handler(request)

        async def on_startup(app):
            timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
            # Shorter than uvicorn's 5 s keep-alive, so that idle connections close here first.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)
            self.session = aiohttp.ClientSession(timeout=timeout, connector=connector)

        async def on_cleanup(app):
            await self.session.close()
            self.log.close()

        app = web.Application(client_max_size=64 * 1024**2, middlewares=[require_key])
        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
        app.router.add_post("/v1/completions", self.handle_completions)
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_post("/tokenize", self.handle_tokenize)
        app.router.add_post("/detokenize", self.handle_detokenize)
        app.router.add_post("/pdbench/flow", self.handle_flow)
        app.router.add_get("/pdbench/stats", self.handle_stats)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        return app


def _authorised(request, key: str) -> bool:
    """Whether the request carries ``key`` as its bearer token (compared in constant time)."""
    given = request.headers.get("Authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def _error(status: int, message: str, headers: dict[str, str] | None = None):
    """An error answer in vLLM's shape (nothing of the instances' addresses in it)."""
    return web.json_response(openai_api.error_body(status, message), status=status, headers=headers)


def _cached_tokens(response: dict[str, Any]) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of an answer (-1: absent)."""
    details = (response.get("usage") or {}).get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return int(cached) if cached is not None else -1


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
