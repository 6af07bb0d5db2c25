"""The router as a serving endpoint: nothing of the instances reaches a client (KV params,
addresses), errors come with vLLM's status codes and shape and are checked before P works,
every refusal is logged with its reason, the client's X-Request-ID comes back, and a client
that leaves during P's prefill closes P's request and counts as a cancel, not a failure.

The upstreams are aiohttp servers of the test's own answering in vLLM's shapes (0.32's and
0.33's: KV params on the final streamed chunk): what the router does with their answers is
router logic; the real servers are the e2e tier's."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from connector.plugin.no_lease import NO_LEASE_KEY
from jobs.serving import openai_api
from jobs.serving.router import Router, RouterConfig

pytestmark = pytest.mark.unit

D_PARAMS = {
    "do_remote_prefill": True,
    "remote_host": "10.1.2.3",
    "remote_port": 5664,
    "remote_block_ids": [[6]],
    "remote_engine_id": "engine-d",
}
DONE = b"data: [DONE]\n\n"


def completion(text: str = "ab") -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "kv_transfer_params": D_PARAMS,
    }


class Upstreams:
    """P and D as vLLM answers: P's prefill, D's answer (streamed or not); ``p_delay_s``
    holds P's answer back; every request P saw and whether it saw it closed."""

    def __init__(self, p_status: int = 200, p_delay_s: float = 0.0):
        self.p_status, self.p_delay_s = p_status, p_delay_s
        self.p_closed = asyncio.Event()
        self.p_requests = 0
        self.d_params: list[dict] = []  # the kv_transfer_params of each request D got

    async def prefill(self, request):
        self.p_requests += 1
        await request.read()
        if self.p_status != 200:
            body = openai_api.error_body(self.p_status, "P says no")
            return web.json_response(body, status=self.p_status)
        try:
            await asyncio.sleep(self.p_delay_s)
        except asyncio.CancelledError:  # aiohttp cancels a handler whose client left
            self.p_closed.set()
            raise
        return web.json_response({**completion("x"), "kv_transfer_params": D_PARAMS})

    async def tokenize(self, request):  # a chat prompt, as D's /tokenize gives it
        await request.read()
        return web.json_response({"tokens": [5, 6, 7]})

    async def decode(self, request):
        body = json.loads(await request.read())
        self.d_params.append(body.get("kv_transfer_params") or {})
        if not body.get("stream"):
            return web.json_response(completion())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        first = {"choices": [{"index": 0, "text": "a", "finish_reason": None}]}
        last = {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}
        await response.write(b"data: " + json.dumps(first).encode() + b"\n\n")
        # vLLM 0.33: D's params on the final chunk; written in two pieces, as a socket may
        final = b"data: " + json.dumps({**last, "kv_transfer_params": D_PARAMS}).encode()
        await response.write(final[:30])
        usage = b""
        if (body.get("stream_options") or {}).get("include_usage"):
            # 3 tokens in 2 chunks: vLLM sends no chunk for a token with no text
            counted = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}
            usage = b"data: " + json.dumps(counted).encode() + b"\n\n"
        await response.write(final[30:] + b"\n\n" + usage + DONE)
        await response.write_eof()
        return response


async def serve(tmp_path, upstreams: Upstreams, exchange, **settings):
    p_app, d_app = web.Application(), web.Application()
    p_app.router.add_post("/v1/completions", upstreams.prefill)
    d_app.router.add_post("/v1/completions", upstreams.decode)
    d_app.router.add_post("/tokenize", upstreams.tokenize)
    # P's server cancels a handler whose client left, as vLLM's aborts the request
    async with TestServer(p_app, handler_cancellation=True) as p, TestServer(d_app) as d:
        config = RouterConfig(
            prefill_urls=[f"http://127.0.0.1:{p.port}"],
            decode_urls=[f"http://127.0.0.1:{d.port}"],
            agg_urls=[],
            kv_params_urls=[f"http://127.0.0.1:{d.port}"],
            host="127.0.0.1",
            port=0,
            cache_hit_threshold=0.8,
            decode_first_fallback="pull",
            decoder_kv_blocks_ttl_s=60.0,
            request_timeout_s=30.0,
            flow="recompute",
            request_log=str(tmp_path / "requests.jsonl"),
            model="m",
            max_model_len=64,
        )
        for name, value in settings.items():
            setattr(config, name, value)
        router = Router(config)
        # as web.run_app serves it: a handler whose client left is not cancelled (the router
        # watches its client during P's prefill itself); aiohttp's TestServer would cancel it
        runner = web.AppRunner(router.app(), handler_cancellation=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as client:
                return router, await exchange(client, f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()


def run(tmp_path, upstreams, exchange, timeout_s: float = 30, **settings):
    return asyncio.run(
        asyncio.wait_for(serve(tmp_path, upstreams, exchange, **settings), timeout_s)
    )


def log_lines(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]


BODY = {"model": "m", "prompt": [5, 6, 7], "max_tokens": 2}


def test_no_kv_params_reach_the_client_streamed_or_not(tmp_path):
    async def exchange(client, url):
        async with client.post(f"{url}/v1/completions", json=BODY) as r:
            plain = await r.read()
        async with client.post(f"{url}/v1/completions", json={**BODY, "stream": True}) as r:
            streamed = await r.read()
        return plain, streamed

    _, (plain, streamed) = run(tmp_path, Upstreams(), exchange)
    for body in (plain, streamed):
        assert b"kv_transfer_params" not in body and b"10.1.2.3" not in body
    assert json.loads(plain)["choices"][0]["text"] == "ab"
    events = [e for e in streamed.split(b"\n\n") if e]
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events if e != DONE.strip()]
    assert texts == ["a", "b"] and events[-1] == DONE.strip()


@pytest.mark.parametrize(
    ("flow", "header", "match_prefix", "leased"),
    [
        ("pull", True, True, True),  # a named conversation: its next turn pulls
        ("pull", False, True, True),  # anonymous, but a next turn may extend it (prefix)
        ("pull", False, False, False),  # anonymous, nothing can recognise a next turn
        ("recompute", True, True, False),  # nothing is ever pulled in recompute
        ("decode_first", False, False, False),
    ],
)
def test_d_keeps_blocks_only_for_a_turn_that_can_be_continued(
    tmp_path, flow, header, match_prefix, leased
):
    """A turn nobody can continue goes to D marked so that D frees its blocks at once
    (connector.plugin.no_lease): single-turn load leaves no dead leases on D."""
    headers = {"X-Session-ID": "c1"} if header else {}

    async def exchange(client, url):
        async with client.post(f"{url}/v1/completions", json=BODY, headers=headers) as r:
            return r.status

    upstreams = Upstreams()
    _, status = run(
        tmp_path, upstreams, exchange, flow=flow, match_prefix=match_prefix, params_wait_s=0.1
    )
    (d_params,) = upstreams.d_params
    assert status == 200 and d_params.get(NO_LEASE_KEY, False) is (not leased)


def test_wrong_requests_get_vllms_codes_before_p_works_and_are_logged(tmp_path):
    upstreams = Upstreams()
    cases = [
        ({**BODY, "max_tokens": 0}, 400, "max_tokens must be a whole number of at least 1"),
        ({**BODY, "max_tokens": -1}, 400, "max_tokens must be a whole number"),
        ({**BODY, "max_tokens": 10**9}, 400, "maximum context length is 64 tokens"),
        ({**BODY, "prompt": list(range(3, 70))}, 400, "the prompt has 67 tokens"),
        ({**BODY, "model": "gpt-4"}, 404, "The model `gpt-4` does not exist."),
    ]

    async def exchange(client, url):
        out = []
        for body, _, _ in cases:
            async with client.post(f"{url}/v1/completions", json=body) as r:
                out.append((r.status, await r.json()))
        async with client.post(f"{url}/v1/completions", data=b"{nope") as r:
            out.append((r.status, await r.json()))
        return out

    router, answers = run(tmp_path, upstreams, exchange)
    for (_, status, text), (got, body) in zip(cases, answers, strict=False):
        assert got == status and text in body["error"]["message"], body
        assert body["error"]["code"] == status and body["error"]["type"]
    assert answers[-1][0] == 400 and "not JSON" in answers[-1][1]["error"]["message"]
    assert upstreams.p_requests == 0  # P never worked on any of them
    assert router.stats.refused == len(cases) + 1 and router.stats.failed == 0
    logged = log_lines(tmp_path)
    assert [x["status"] for x in logged] == [s for _, s, _ in cases] + [400]
    assert all(x["error"] for x in logged)


def test_an_instance_refusal_keeps_its_status_and_names_no_address(tmp_path):
    async def exchange(client, url):
        async with client.post(f"{url}/v1/completions", json=BODY) as r:
            return r.status, await r.read()

    router, (status, body) = run(tmp_path, Upstreams(p_status=400), exchange)
    assert status == 400 and json.loads(body)["error"]["message"] == "P says no"
    assert b"127.0.0.1" not in body and router.stats.failed == 0
    router, (status, body) = run(tmp_path, Upstreams(p_status=500), exchange)
    assert status == 502 and b"127.0.0.1" not in body and b"http" not in body
    assert json.loads(body)["error"]["message"] == "the prefill instance failed (HTTP 500)"
    assert router.stats.failed == 1


def test_the_clients_request_id_comes_back_and_is_logged(tmp_path):
    async def exchange(client, url):
        headers = {"X-Request-ID": "client-42"}
        async with client.post(f"{url}/v1/completions", json=BODY, headers=headers) as r:
            plain = r.headers.get("X-Request-ID")
        streamed_body = {**BODY, "stream": True}
        async with client.post(
            f"{url}/v1/completions", json=streamed_body, headers={"X-Request-ID": "client-43"}
        ) as r:
            await r.read()
            return plain, r.headers.get("X-Request-ID")

    _, echoed = run(tmp_path, Upstreams(), exchange)
    assert echoed == ("client-42", "client-43")
    assert [x["client_request_id"] for x in log_lines(tmp_path)] == ["client-42", "client-43"]


def test_a_client_gone_during_the_prefill_closes_ps_request_and_is_a_cancel(tmp_path):
    upstreams = Upstreams(p_delay_s=30.0)

    async def exchange(client, url):
        try:
            async with client.post(
                f"{url}/v1/completions", json=BODY, timeout=aiohttp.ClientTimeout(total=0.5)
            ) as r:
                await r.read()
        except TimeoutError:
            pass  # the client gives up and closes its connection
        await asyncio.wait_for(upstreams.p_closed.wait(), timeout=10)
        for _ in range(100):  # the router logs the cancel once it has seen it
            if (tmp_path / "requests.jsonl").exists() and log_lines(tmp_path):
                break
            await asyncio.sleep(0.05)
        return True

    router, _ = run(tmp_path, upstreams, exchange)
    assert upstreams.p_closed.is_set()  # P's request was closed: vLLM aborts it
    assert router.stats.cancelled == 1 and router.stats.failed == 0
    (line,) = log_lines(tmp_path)
    assert line["status"] == 499, line
    assert line["error"] == "client disconnected: the client left while P prefilled its prompt"


def test_the_flow_endpoint_refuses_bodies_it_cannot_read(tmp_path):
    async def exchange(client, url):
        out = []
        for data in (b"{nope", b"[1, 2]", b'{"flow": "warp"}'):
            async with client.post(f"{url}/pdbench/flow", data=data) as r:
                out.append((r.status, (await r.json())["error"]))
        return out

    _, answers = run(tmp_path, Upstreams(), exchange)
    assert [s for s, _ in answers] == [400, 400, 400]
    assert "not JSON" in answers[0][1] and "JSON object" in answers[1][1]
    assert "flow='warp'" in answers[2][1]


def test_completion_stream_passes_events_untouched_unless_they_carry_params():
    stream = openai_api.CompletionStream(json.loads, lambda x: json.dumps(x).encode())
    plain = b'data: {"choices": [{"text": "a"}]}\n\n'
    assert stream.feed(plain) == plain
    assert stream.feed(b'data: {"choices": [], "kv_transfer_') == b""  # waits for the rest
    out = stream.feed(b'params": {"remote_port": 1}}\n\n' + DONE)
    assert b"kv_transfer_params" not in out and out.endswith(DONE)


def test_metrics_are_prometheus_text_by_route_and_status(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    async def exchange(client, url):
        async with client.post(f"{url}/v1/completions", json={**BODY, "stream": True}) as r:
            await r.read()
        async with client.post(f"{url}/v1/completions", json={**BODY, "max_tokens": 0}) as r:
            await r.read()
        async with client.get(f"{url}/metrics") as r:
            return r.headers["Content-Type"], await r.text()

    _, (content_type, text) = run(tmp_path, Upstreams(), exchange)
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {
        (s.labels["route"], s.labels["status"]): s.value
        for s in families["pdbench_router_requests"].samples
        if s.name.endswith("_total")
    }
    assert requests == {("recompute", "200"): 1.0, ("", "400"): 1.0}
    ttft = [s for s in families["pdbench_router_ttft_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels["route"], s.value) for s in ttft] == [("recompute", 1.0)]
    chunk = families["pdbench_router_time_per_chunk_seconds"].samples
    assert [s.value for s in chunk if s.name.endswith("_count")] == [1.0]  # 2 chunks streamed
    (in_flight,) = families["pdbench_router_in_flight"].samples
    assert in_flight.labels == {"prefill": "prefill0"} and in_flight.value == 0.0


def test_with_a_key_every_endpoint_but_health_wants_it(tmp_path, monkeypatch):
    """PDBENCH_API_KEY set: each endpoint answers 401 in vLLM's error shape without the
    key or with a wrong one, serves with it; /health stays open for liveness probes."""
    monkeypatch.setenv("PDBENCH_API_KEY", "s3cret")
    calls = [
        ("post", "/v1/completions", BODY),
        ("post", "/v1/chat/completions", {"model": "m", "messages": []}),
        ("post", "/pdbench/flow", {"flow": "pull"}),
        ("get", "/pdbench/stats", None),
        ("get", "/metrics", None),
        ("get", "/v1/models", None),
        ("post", "/tokenize", {"model": "m", "prompt": "a"}),
    ]

    async def exchange(client, url):
        out = {}
        for auth in (None, "Bearer wrong", "Basic s3cret", "Bearer s3cret"):
            headers = {"Authorization": auth} if auth else {}
            for method, path, body in calls:
                async with client.request(method, url + path, json=body, headers=headers) as r:
                    out[(auth, path)] = (r.status, await r.text())
            async with client.get(f"{url}/health", headers=headers) as r:
                out[(auth, "/health")] = (r.status, await r.text())
        return out

    _, got = run(tmp_path, Upstreams(), exchange)
    for auth in (None, "Bearer wrong", "Basic s3cret"):
        for _, path, _ in calls:
            status, text = got[(auth, path)]
            assert status == 401, (auth, path)
            assert json.loads(text)["error"]["code"] == 401 and "s3cret" not in text
        assert got[(auth, "/health")][0] == 200
    assert got[("Bearer s3cret", "/v1/completions")][0] == 200
    assert got[("Bearer s3cret", "/pdbench/stats")][0] == 200
    assert got[("Bearer s3cret", "/pdbench/flow")][0] == 200
    assert got[("Bearer s3cret", "/metrics")][0] == 200


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("asked", [False, True])
def test_a_streamed_answers_length_comes_from_ds_usage_shown_only_if_asked(tmp_path, api, asked):
    """The log's output_tokens of a stream is D's usage count (its chunks undercount it);
    a client that asked no usage event gets none."""
    body = {**BODY, "stream": True}
    if api == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    if asked:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/completions" if api == "completions" else "/v1/chat/completions"

    async def exchange(client, url):
        async with client.post(f"{url}{path}", json=body) as r:
            return await r.read()

    _, streamed = run(tmp_path, Upstreams(), exchange)
    events = [json.loads(e[6:]) for e in streamed.split(b"\n\n") if e and e != DONE.strip()]
    usage = [e for e in events if "usage" in e]
    assert len(usage) == (1 if asked else 0)
    (line,) = log_lines(tmp_path)
    assert line["output_tokens"] == 3 and line["status"] == 200
