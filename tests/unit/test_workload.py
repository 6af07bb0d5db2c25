import random
import statistics

import pytest

from jobs.request_stream import (
    ChunkClock,
    RequestOptions,
    _handle_event,
    completion_body,
    describe_failure,
    tpot_ms,
)
from jobs.workload import FIRST_ID, build_conversations
from pdbench.config.schema import WorkloadConfig, WorkloadKind
from pdbench.plan.lengths import draw_length, max_length
from pdbench.results.store import RequestRecord

pytestmark = pytest.mark.unit


def test_conversations_are_deterministic_and_sized():
    wl = WorkloadConfig(conversations=3, turns=4, user_tokens=64, seed=1)
    a = build_conversations(wl, 128, vocab_size=512)
    b = build_conversations(wl, 128, vocab_size=512)
    assert [s.prefix for s in a] == [s.prefix for s in b]
    assert all(len(s.prefix) == 128 and len(s.user_turns) == 4 for s in a)
    assert all(len(u) == 64 for s in a for u in s.user_turns)
    ids = [t for s in a for u in s.user_turns for t in u]
    assert min(ids) >= FIRST_ID and max(ids) < 512
    assert a[0].prefix != a[1].prefix


def test_body_is_greedy_exact_length_streaming():
    body = completion_body(RequestOptions("http://x", "m", 16, "pull", "salt"), [5, 6])
    assert body["temperature"] == 0.0 and body["ignore_eos"] is True
    assert body["max_tokens"] == body["min_tokens"] == 16
    assert body["stream"] and body["return_token_ids"] and body["cache_salt"] == "salt"


def test_sse_events_fill_the_record():
    rec = RequestRecord(0, 1, "agg", 2, 0, [], 0.0, [], 0.0, 0.0)
    assert _handle_event(b'data: {"choices":[{"token_ids":[7]}]}', rec) == 1
    assert _handle_event(b'data: {"choices":[{"token_ids":[8,9]}]}', rec) == 2
    usage = b'data: {"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":64}}}'
    assert _handle_event(usage, rec) == 0
    assert _handle_event(b"data: [DONE]", rec) == 0
    assert rec.output_token_ids == [7, 8, 9] and rec.cached_tokens == 64
    with pytest.raises(RuntimeError, match="server error"):
        _handle_event(b'data: {"error": {"message": "boom"}}', rec)


def sse(*token_lists: list[int]) -> bytes:
    """SSE events of a completions stream, one per list of token ids."""
    return b"".join(
        b'data: {"choices":[{"token_ids":%s}]}\n\n' % str(t).encode() for t in token_lists
    )


USAGE_AND_DONE = b'data: {"choices":[],"usage":{"prompt_tokens_details":null}}\n\ndata: [DONE]\n\n'


def clocked(reads: list[tuple[float, bytes]], start: float = 10.0) -> RequestRecord:
    """A record timed by ``ChunkClock`` from (arrival seconds, bytes) reads."""
    rec = RequestRecord(0, 1, "agg", 2, 0, [], 0.0, [], 0.0, 0.0)
    clock = ChunkClock(rec, start)
    for now, data in reads:
        clock.feed(data, now)
    clock.finish(reads[-1][0] + 0.5)
    return rec


def test_one_itl_per_chunk_and_no_zero_for_a_chunk_of_several_tokens():
    # 1 token at +100 ms, 3 tokens in one event at +120, 1 at +150, then usage + DONE later.
    rec = clocked(
        [(10.1, sse([5])), (10.12, sse([6, 7, 8])), (10.15, sse([9])), (10.3, USAGE_AND_DONE)]
    )
    assert rec.output_token_ids == [5, 6, 7, 8, 9]
    assert rec.chunk_tokens == [1, 3, 1]
    assert rec.ttft_ms == pytest.approx(100.0)
    assert rec.itl_ms == pytest.approx([20.0, 30.0])
    assert len(rec.chunk_tokens) == len(rec.itl_ms) + 1 and 0.0 not in rec.itl_ms
    assert rec.e2e_ms == pytest.approx(150.0)  # to the last token, not to [DONE]
    assert rec.tpot_ms == pytest.approx((150.0 - 100.0) / 4)  # 4 tokens after the first


def test_events_of_one_read_are_one_chunk_and_split_events_are_joined():
    first, second = sse([5]), sse([6], [7])
    reads = [(10.01, first[:9]), (10.02, first[9:]), (10.05, second), (10.07, sse([8])[:-2])]
    reads.append((10.09, b"\n\n" + USAGE_AND_DONE))  # the last event ends in this read
    rec = clocked(reads)
    assert rec.chunk_tokens == [1, 2, 1]  # the half event brought no tokens; two events, one read
    assert rec.ttft_ms == pytest.approx(20.0)
    assert rec.itl_ms == pytest.approx([30.0, 40.0])
    assert rec.e2e_ms == pytest.approx(90.0)
    assert rec.tpot_ms == pytest.approx(70.0 / 3)


def test_tpot_is_zero_for_one_token_and_a_single_chunk_has_no_itl():
    rec = clocked([(10.2, sse([5])), (10.2, USAGE_AND_DONE)])
    assert (rec.chunk_tokens, rec.itl_ms, rec.tpot_ms) == ([1], [], 0.0)
    assert rec.e2e_ms == pytest.approx(rec.ttft_ms) == pytest.approx(200.0)
    rec = clocked([(10.2, sse([5, 6, 7, 8]) + USAGE_AND_DONE)])  # all in one chunk
    assert (rec.chunk_tokens, rec.itl_ms, rec.tpot_ms) == ([4], [], 0.0)
    assert tpot_ms(100.0, 100.0, 0) == tpot_ms(100.0, 250.0, 1) == 0.0
    assert tpot_ms(100.0, 250.0, 4) == pytest.approx(50.0)


def test_a_failed_stream_keeps_its_tokens_timed_and_its_e2e_runs_to_the_failure():
    rec = RequestRecord(0, 1, "agg", 2, 0, [], 0.0, [], 0.0, 0.0)
    clock = ChunkClock(rec, 10.0)
    clock.feed(sse([5]), 10.1)
    with pytest.raises(RuntimeError, match="server error"):
        clock.feed(sse([6, 7]) + b'data: {"error": {"message": "boom"}}\n\n', 10.2)
    rec.status = "failed"
    clock.finish(10.4)
    assert rec.chunk_tokens == [1, 2] and rec.itl_ms == pytest.approx([100.0])
    assert rec.e2e_ms == pytest.approx(400.0)


def test_long_doc_shares_one_prefix_and_jitter_varies_lengths():
    long_doc = WorkloadConfig(
        kind=WorkloadKind.long_doc, conversations=3, turns=5, user_tokens=40, seed=3
    )
    long_doc.user_tokens_jitter = 0.5
    specs = build_conversations(long_doc, 256, 512)
    assert specs[0].prefix == specs[1].prefix == specs[2].prefix
    lengths = {len(u) for s in specs for u in s.user_turns}
    assert len(lengths) > 1 and min(lengths) >= 20 and max(lengths) <= 60
    multi_turn = WorkloadConfig(conversations=2, turns=1, user_tokens=8, seed=3)
    multi = build_conversations(multi_turn, 64, 512)
    assert multi[0].prefix != multi[1].prefix


def test_lengths_fixed_uniform_or_lognormal_around_the_mean():
    rng = random.Random(0)
    assert {draw_length(rng, 64, 0.0, "lognormal") for _ in range(50)} == {64}
    uniform = [draw_length(rng, 100, 0.5, "uniform") for _ in range(20_000)]
    assert min(uniform) >= 50 and max(uniform) <= 150 == max_length(100, 0.5)
    assert statistics.fmean(uniform) == pytest.approx(100, rel=0.02)
    tail = [draw_length(rng, 100, 0.5, "lognormal") for _ in range(20_000)]
    assert statistics.fmean(tail) == pytest.approx(100, rel=0.05)  # same mean ...
    assert max(tail) > 150 and statistics.median(tail) < 95  # ... a long tail, lower median
    assert max(tail) <= max_length(100, 0.5, "lognormal") == 250  # clipped
    again = random.Random(0)
    assert [draw_length(again, 64, 0.0, "lognormal") for _ in range(50)] == [64] * 50


def test_output_lengths_are_drawn_per_turn_and_sent_exactly():
    wl = WorkloadConfig(conversations=2, turns=4, user_tokens=16, output_tokens=8, seed=5)
    fixed = build_conversations(wl, 0, 512)
    assert all(s.output_lens == [8] * 4 for s in fixed)
    wl.output_tokens_jitter, wl.length_distribution = 0.5, "uniform"
    varied = build_conversations(wl, 0, 512)
    outs = [n for s in varied for n in s.output_lens]
    assert len(set(outs)) > 1 and min(outs) >= 4 and max(outs) <= 12
    # Drawing output lengths leaves the prompts' token ids alone.
    assert [s.user_turns for s in varied] == [s.user_turns for s in fixed]
    opts = RequestOptions("http://x", "m", 16, "pull", "salt")
    body = completion_body(opts, [5, 6], output_tokens=outs[0])
    assert body["max_tokens"] == body["min_tokens"] == outs[0]


def test_a_bare_timeout_names_the_limit_it_hit():
    assert describe_failure(TimeoutError(), 120.0) == (
        "TimeoutError: no complete answer within 120 s "
        "(workload.request_timeout_s; a stalled server also shows here)"
    )
    assert describe_failure(RuntimeError("stream ended without tokens"), 120.0) == (
        "RuntimeError: stream ended without tokens"
    )
