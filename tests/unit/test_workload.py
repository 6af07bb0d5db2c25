import json
import random
import statistics

import pytest

from jobs.request_stream import (
    ChunkClock,
    RequestOptions,
    _handle_event,
    chat_body,
    completion_body,
    describe_failure,
    tpot_ms,
)
from jobs.workload import FIRST_ID, build_conversations
from pdbench.config.schema import HistoryEdit, WorkloadConfig, WorkloadKind
from pdbench.plan.lengths import draw_history, draw_length, max_length
from records.point import RequestRecord

pytestmark = pytest.mark.unit


def test_conversations_are_deterministic_and_sized():
    wl = WorkloadConfig(conversations=[3], turns=4, user_tokens=64, seed=1)
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
        kind=WorkloadKind.long_doc, conversations=[3], turns=5, user_tokens=40, seed=3
    )
    long_doc.user_tokens_jitter = 0.5
    specs = build_conversations(long_doc, 256, 512)
    assert specs[0].prefix == specs[1].prefix == specs[2].prefix
    lengths = {len(u) for s in specs for u in s.user_turns}
    assert len(lengths) > 1 and min(lengths) >= 20 and max(lengths) <= 60
    multi_turn = WorkloadConfig(conversations=[2], turns=1, user_tokens=8, seed=3)
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
    wl = WorkloadConfig(conversations=[2], turns=4, user_tokens=16, output_tokens=8, seed=5)
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


def test_the_seed_benchmarks_shape_common_prefix_lognormal_prefixes_and_turn_ranges():
    """multi_turn_vllm's parameters: every conversation starts with the same common prefix,
    then a prefix of its own whose length is lognormal with the given mean and median ratio
    (vLLM benchmarks/multi_turn's), capped; turns uniform in [turns, turns_max]."""
    wl = WorkloadConfig(
        conversations=[400],
        turns=6,
        turns_max=9,
        common_prefix_tokens=50,
        history_median_ratio=0.85,
        history_tokens_max=1200,
        user_tokens=4,
        output_tokens=4,
        seed=1,
    )
    specs = build_conversations(wl, 400, 512)
    common = specs[0].prefix[:50]
    assert all(s.prefix[:50] == common for s in specs)
    own = [len(s.prefix) - 50 for s in specs]
    assert max(own) <= 1200 and min(own) >= 1
    assert statistics.fmean(own) == pytest.approx(400, rel=0.06)
    assert statistics.median(own) == pytest.approx(0.85 * 400, rel=0.08)
    turns = [len(s.user_turns) for s in specs]
    assert set(turns) == {6, 7, 8, 9}
    assert all(len(s.output_lens) == len(s.user_turns) for s in specs)
    rng = random.Random(0)
    assert {draw_history(rng, 400, 1.0, 0) for _ in range(20)} == {400}  # 1: fixed


def test_a_workload_without_the_new_settings_draws_the_same_tokens_as_before():
    """common prefix 0, ratio 1, no turns_max: the same token ids and lengths as a plain
    multi_turn workload (runs before these settings pair with runs after)."""
    plain = WorkloadConfig(conversations=[3], turns=3, user_tokens=16, user_tokens_jitter=0.5)
    again = WorkloadConfig(
        conversations=[3],
        turns=3,
        user_tokens=16,
        user_tokens_jitter=0.5,
        turns_max=3,
        common_prefix_tokens=0,
        history_median_ratio=1.0,
    )
    a, b = build_conversations(plain, 32, 512), build_conversations(again, 32, 512)
    assert [(s.prefix, s.user_turns) for s in a] == [(s.prefix, s.user_turns) for s in b]


def test_history_edits_fall_on_a_seeded_share_of_turns_the_same_in_every_build():
    wl = WorkloadConfig(
        conversations=[40], turns=6, history_edit=HistoryEdit.mixed, history_edit_share=0.5
    )
    specs = build_conversations(wl, 16, 512)
    edits = [e for s in specs for e in s.edits.values()]
    assert set(edits) == {"strip_reply", "change_message"}
    assert len(edits) / (40 * 5) == pytest.approx(0.5, abs=0.1)  # turns 2-6
    assert all(1 not in s.edits for s in specs)  # nothing to edit before turn 1
    assert [s.edits for s in build_conversations(wl, 16, 512)] == [s.edits for s in specs]
    wl.history_edit = HistoryEdit.none
    assert all(not s.edits for s in build_conversations(wl, 16, 512))


def test_a_chat_request_asks_the_same_greedy_tokens_as_a_completion():
    opts = RequestOptions("http://x", "m", 16, "pull", "salt", api="chat")
    chat = chat_body(opts, [{"role": "user", "content": "ba ke"}], output_tokens=5)
    plain = completion_body(opts, [5, 6], output_tokens=5)
    assert chat.pop("messages") == [{"role": "user", "content": "ba ke"}]
    assert chat.pop("max_completion_tokens") == plain.pop("max_tokens") == 5
    plain.pop("prompt")
    assert chat == plain


def test_a_chat_stream_gives_its_tokens_text_and_the_servers_prompt_count():
    rec = RequestRecord(0, 1, "pull", 10, 0, [], 0.0, [], 0.0, 0.0)
    texts: list[str] = []
    first = {"choices": [{"delta": {"role": "assistant", "content": "ba"}, "token_ids": [7]}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 2}}
    for data in (first, {"choices": [{"delta": {"content": " ke"}, "token_ids": [8]}]}, usage):
        _handle_event(b"data: " + json.dumps(data).encode(), rec, texts)
    assert rec.output_token_ids == [7, 8] and "".join(texts) == "ba ke"
    assert rec.prompt_tokens == 42


def test_the_warm_up_builds_its_conversations_from_a_workload_of_one_value_per_axis():
    from jobs.run.warm_up import warm_workload
    from pdbench.plan.deployments import make_plan
    from tests.unit.helpers import cpu_run

    (dep,) = make_plan(cpu_run()).deployments
    warm, n = warm_workload(dep)
    specs = build_conversations(warm, 64, vocab_size=512)
    assert len(specs) == n == 1 and warm.conversations == [n]
