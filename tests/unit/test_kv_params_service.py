"""D's KV params over HTTP from its plugin to the router: the board (taken once, waited
for, bounded), the real HTTP server on a loopback port, and the router's fetch."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import aiohttp
import pytest

from connector.plugin.kv_params_service import OUTPUT_IDS_KEY, ParamsBoard, ParamsServer, parse_addr
from jobs.serving.router import Router, RouterConfig
from pdbench.config.schema import FlowConfig
from pdbench.spec.launch import router_settings

pytestmark = pytest.mark.unit

# vLLM wraps the router's X-Request-Id: cmpl-<id>-<prompt index>-<random>
VLLM_ID = "cmpl-pdb-pull-h0-t2-0123456789ab-d-0-1a2b3c4d"
PARAMS = {"remote_block_ids": [3, 4], "remote_num_tokens": 64, "do_remote_decode": False}


def test_params_are_found_by_the_routers_id_and_taken_once():
    board = ParamsBoard()
    board.put(VLLM_ID, PARAMS)
    assert board.take("pdb-pull-h0-t2-0123456789ab-d-0-1a2b3c4d-nope") is None
    assert json.loads(board.take("pdb-pull-h0-t2-0123456789ab-d")) == PARAMS
    assert board.take("pdb-pull-h0-t2-0123456789ab-d") is None and len(board) == 0


def test_the_board_keeps_params_by_the_id_vllm_wraps_and_serialises_on_take():
    board = ParamsBoard()
    board.put(VLLM_ID, PARAMS)
    assert list(board._entries) == ["pdb-pull-h0-t2-0123456789ab-d"]  # one dict lookup
    assert board._entries["pdb-pull-h0-t2-0123456789ab-d"][1] is PARAMS  # not serialised yet


def test_a_take_waits_for_params_that_come_later():
    board = ParamsBoard()
    threading.Timer(0.05, board.put, (VLLM_ID, PARAMS)).start()
    assert json.loads(board.take("pdb-pull-h0-t2-0123456789ab-d", wait_s=10)) == PARAMS


def test_params_nobody_asks_for_do_not_pile_up():
    board = ParamsBoard(max_entries=3)
    for i in range(5):
        board.put(f"cmpl-r{i}-0-1a2b3c4d", {"i": i})
    assert len(board) == 3 and board.take("r0") is None and board.take("r4") is not None
    old = ParamsBoard(ttl_s=0.0)
    old.put("a", {})
    time.sleep(0.01)
    old.put("b", {})
    assert old.take("a") is None


def test_addresses_are_host_and_port():
    assert parse_addr("10.0.0.2:5727") == ("10.0.0.2", 5727)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_addr("10.0.0.2")


@pytest.fixture
def service():
    server = ParamsServer(ParamsBoard(), "127.0.0.1", 0).start()
    yield server
    server.stop()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_service_answers_over_http(service):
    base = f"http://127.0.0.1:{service.port}"
    assert get(f"{base}/health") == (200, b"ok")
    service.board.put(VLLM_ID, PARAMS)
    status, body = get(f"{base}/kv_params/pdb-pull-h0-t2-0123456789ab-d?wait_s=1")
    assert status == 200 and json.loads(body) == PARAMS
    status, body = get(f"{base}/kv_params/pdb-pull-h0-t2-0123456789ab-d?wait_s=0.05")
    assert status == 404 and b"no params" in body


def test_the_router_fetches_ds_params_from_ds_service(service):
    url = f"http://127.0.0.1:{service.port}"
    settings = router_settings(FlowConfig(), 30.0, 8000)
    router = Router(
        RouterConfig(
            prefill_urls=["http://p0"],
            decode_urls=["http://d0", "http://d1"],
            agg_urls=[],
            kv_params_urls=["http://127.0.0.1:9", url],  # d1's service is the live one
            host="127.0.0.1",
            params_wait_s=0.2,
            **settings,
        )
    )
    service.board.put(VLLM_ID, PARAMS)

    async def go():
        async with aiohttp.ClientSession() as session:
            router.session = session
            got = await router._fetch_params("http://d1", "pdb-pull-h0-t2-0123456789ab-d")
            gone = await router._fetch_params("http://d1", "pdb-pull-h0-t2-0123456789ab-d")
            down = await router._fetch_params("http://d0", "pdb-x-d")  # nothing listens
            return got, gone, down

    got, gone, down = asyncio.run(go())
    assert got == PARAMS and gone is None and down is None


def test_ds_output_ids_travel_beside_its_params_and_the_params_stay_vllms():
    """The router needs D's output ids to know which tokens D holds; vLLM's params dict
    (what P is handed) is not changed on the board."""
    board = ParamsBoard()
    params = dict(PARAMS)
    board.put(VLLM_ID, params, [11, 12, 13])
    got = json.loads(board.take("pdb-pull-h0-t2-0123456789ab-d"))
    assert got == {**PARAMS, OUTPUT_IDS_KEY: [11, 12, 13]}
    assert params == PARAMS
