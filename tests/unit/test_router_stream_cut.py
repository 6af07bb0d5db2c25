"""A stream that breaks after it began: the router cuts its client off at once.

The upstream here is an aiohttp server of the test's own that answers like vLLM's streamed
completions (SSE chunks) and then dies mid-answer (its connection closed): what the router
does then is router logic; the real D dying is the e2e fault test's (tests/e2e/test_faults.py).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from jobs.serving.router import Router, RouterConfig

pytestmark = pytest.mark.unit

CHUNK = b'data: {"choices": [{"index": 0, "text": "a", "finish_reason": null}]}\n\n'


async def dying_upstream(request):
    response = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(CHUNK)
    await asyncio.sleep(0.2)
    request.transport.close()  # D dies mid-answer
    await asyncio.sleep(3600)  # never ends its answer
    return response


async def cut_stream(tmp_path) -> tuple[list[bytes], BaseException | None, dict]:
    upstream_app = web.Application()
    upstream_app.router.add_post("/v1/completions", dying_upstream)
    async with TestServer(upstream_app) as upstream:
        url = f"http://127.0.0.1:{upstream.port}"
        config = RouterConfig(
            prefill_urls=[],
            decode_urls=[url],
            agg_urls=[url],
            kv_params_urls=[url],
            host="127.0.0.1",
            port=0,
            cache_hit_threshold=0.0,
            decode_first_fallback="recompute",
            decoder_kv_blocks_ttl_s=60.0,
            request_timeout_s=3600.0,  # a router that waited would hang the test
            request_log=str(tmp_path / "requests.jsonl"),
        )
        router = Router(config)
        async with TestServer(router.app()) as server, aiohttp.ClientSession() as client:
            body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 8, "stream": True}
            got, error = [], None
            try:
                async with client.post(
                    f"http://127.0.0.1:{server.port}/v1/completions", json=body
                ) as r:
                    async for chunk in r.content.iter_any():
                        got.append(chunk)
            except aiohttp.ClientError as exc:
                error = exc
            return got, error, router.stats.failed


def test_a_stream_cut_mid_answer_fails_the_client_now_and_is_logged(tmp_path):
    got, error, failed = asyncio.run(asyncio.wait_for(cut_stream(tmp_path), timeout=60))
    assert got and got[0].startswith(b"data:")  # the answer had begun
    assert error is not None  # ... and the client saw it break, not a clean end
    assert failed == 1
    (line,) = (tmp_path / "requests.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert record["status"] == 502 and record["error"].startswith("stream cut"), record
