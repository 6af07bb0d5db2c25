"""The decode node's bill: occupancy samples -> block-seconds, records -> holds per request."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from jobs.measure import decode_bill, kv_sampler, metrics
from records.point import RequestRecord

pytestmark = pytest.mark.unit

METRICS_TEXT = (
    'vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="257",'
    'num_gpu_blocks_override="257"} 1.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 3.0\n'
)


def rec(conversation, turn, path, start_s, e2e_ms, prefill_ms=-1.0, prompt=60, out=4):
    return RequestRecord(
        conversation=conversation,
        turn=turn,
        flow="pull",
        prompt_tokens=prompt,
        history_tokens=0,
        output_token_ids=[1] * out,
        ttft_ms=10.0,
        itl_ms=[],
        e2e_ms=e2e_ms,
        start_s=start_s,
        path=path,
        prefill_ms=prefill_ms,
    )


def test_the_sampler_reads_blocks_usage_and_expired_leases():
    assert kv_sampler.num_gpu_blocks(METRICS_TEXT) == 257
    assert kv_sampler.num_gpu_blocks("vllm:other 1\n") == 0
    row = kv_sampler.sample_row(1.23456, metrics.parse_prometheus(METRICS_TEXT))
    assert row == [1.235, 0.5, 0.0, 3.0]


def test_block_seconds_above_the_starting_level():
    # 256 usable blocks; usage 0.1 -> 0.6 for 10 s -> back: 0.5 x 256 x 10 s (+ ramps)
    samples = [[0, 0.1, 0, 0], [1, 0.6, 1, 0], [11, 0.6, 0, 0], [12, 0.1, 0, 0]]
    full = decode_bill.above_baseline_block_s(samples, 257)
    assert full == pytest.approx(256 * 0.5 * (0.5 + 10 + 0.5))
    # from t=11 on (the tail): only the last ramp down
    assert decode_bill.above_baseline_block_s(samples, 257, 11) == pytest.approx(256 * 0.25)
    assert decode_bill.tail_seconds(samples, 1.0) == 11.0
    assert decode_bill.tail_seconds(samples[:3], 1.0) == -1.0  # never came back


def test_holds_pulled_until_ps_prefill_ended_else_the_ttl():
    records = [
        rec(0, 1, "recompute", start_s=0.0, e2e_ms=1000),  # ends at 1.0
        rec(0, 2, "pull", start_s=3.0, e2e_ms=800, prefill_ms=500),  # pulled at 3.5
        rec(1, 1, "recompute", start_s=0.0, e2e_ms=500),  # next turn recompute: never read
        rec(1, 2, "recompute_expired", start_s=40.0, e2e_ms=500),
        rec(2, 1, "agg", start_s=0.0, e2e_ms=500),  # agg: D kept nothing
    ]
    holds = decode_bill.request_holds(records, block_size=32, ttl_s=20.0)
    # 60 prompt + 4 output tokens = 2 blocks each
    assert holds == [(2, 2.5, True), (2, 20.0, False), (2, 20.0, False), (2, 20.0, False)]


def test_bill_splits_pulled_and_never_pulled_and_reads_ds_own_latency():
    records = [
        rec(0, 1, "recompute", start_s=0.0, e2e_ms=1000),
        rec(0, 2, "pull", start_s=3.0, e2e_ms=800, prefill_ms=500),
    ]
    timeline = {"decode0": [[0, 0.0, 0, 0], [2, 0.5, 1, 0], [4, 0.5, 0, 0], [6, 0.0, 0, 1]]}
    deltas = {
        "decode0": {
            "vllm:nixl_num_kv_expired_reqs_total": 1.0,
            "vllm:inter_token_latency_seconds_sum": 0.3,
            "vllm:inter_token_latency_seconds_count": 30.0,
            "vllm:request_time_per_output_token_seconds_sum": 0.02,
            "vllm:request_time_per_output_token_seconds_count": 2.0,
        },
        "prefill0": {"vllm:nixl_num_kv_expired_reqs_total": 5.0},  # P's: not D's bill
    }
    b = decode_bill.bill(
        records, timeline, {"decode0": 101}, 4.0, deltas, ["decode0"], 32, 20.0, True
    )
    assert (b.pulled_requests, b.never_pulled_requests) == (1, 1)
    assert b.pulled_block_s == pytest.approx(2 * 2.5)
    assert b.never_pulled_block_s == pytest.approx(2 * 20.0)
    assert b.expired_leases == 1.0
    assert b.itl_ms_server == pytest.approx(10.0) and b.tpot_ms_server == pytest.approx(10.0)
    assert b.usage_peak == 0.5 and b.usage_mean == pytest.approx(1.0 / 3)
    assert b.tail_s == 2.0 and b.blocks == 101
    assert b.release_s == pytest.approx(2.2)  # the pull turn ended at 3.8 s; D idle again at 6 s
    assert b.block_s == pytest.approx(100 * (0.5 + 1.0 + 0.5))
    # not bidirectional: D keeps nothing after a request, no holds are counted
    b = decode_bill.bill(records, {}, {}, 0.0, deltas, ["decode0"], 32, 20.0, False)
    assert b.pulled_requests == b.never_pulled_requests == 0 and b.tail_s == -1.0


class ScriptedMetrics:
    """A /metrics endpoint whose KV usage follows a script, one value per scrape."""

    def __init__(self, usages: list[float], blocks: int = 257):
        self.usages = list(usages)
        self.blocks = blocks
        self.scrapes = 0

    async def handle(self, request):
        usage = self.usages[min(self.scrapes, len(self.usages) - 1)]
        self.scrapes += 1
        text = (
            f'vllm:cache_config_info{{engine="0",num_gpu_blocks="{self.blocks}"}} 1.0\n'
            f'vllm:kv_cache_usage_perc{{engine="0"}} {usage}\n'
        )
        return web.Response(text=text)


def sample_a_scripted_load(script: ScriptedMetrics, load_scrapes: int) -> kv_sampler.KvSampler:
    """Sample ``script`` every 10 ms (a 30 s tail) while "the load" runs: until it has
    been scraped ``load_scrapes`` times."""

    async def go():
        app = web.Application()
        app.router.add_get("/metrics", script.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                urls = {"decode0": f"http://127.0.0.1:{port}"}
                kv = await kv_sampler.start(session, urls, 0.01, ["decode0"], tail_s=30.0)
                while script.scrapes < load_scrapes:
                    await asyncio.sleep(0.01)
                await kv.stop()
                return kv
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def test_the_sampler_settles_before_and_samples_the_tail_after_the_load():
    # the first scrape reads blocks; 0.3 left from earlier (settles to 0), then the load
    # raises it to 0.5, and the TTL brings it back to 0 after the load
    script = ScriptedMetrics([0.0, 0.3, 0.3, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.0])
    kv = sample_a_scripted_load(script, load_scrapes=7)
    usages = [s[1] for s in kv.timeline["decode0"]]
    assert kv.blocks == {"decode0": 257}
    assert usages[0] == 0.0  # settled before the Point: nothing left from earlier
    assert 0.5 in usages and usages[-1] == 0.0  # the tail was sampled down to the baseline
    assert 0.3 not in usages  # what was held before the Point is not in its timeline


def test_the_tail_waits_for_a_sample_taken_after_the_load():
    # a short load: every sample during it read 0 (D's blocks not yet shown), the blocks it
    # left held show after it ended; a CI run stopped at that stale 0 and missed the tail
    script = ScriptedMetrics([0.0, 0.0, 0.0, 0.0, 0.04, 0.04, 0.04, 0.04, 0.04, 0.0])
    kv = sample_a_scripted_load(script, load_scrapes=4)
    usages = [s[1] for s in kv.timeline["decode0"]]
    assert 0.04 in usages and usages[-1] == 0.0
    assert decode_bill.tail_seconds(kv.timeline["decode0"], kv.load_end_s) > 0
