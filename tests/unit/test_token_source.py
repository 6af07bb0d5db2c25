"""The calibrated token source's pure parts: schedule, ids, chunks, and the error arithmetic."""

from __future__ import annotations

import json

import pytest

from benchmarks.timing_fidelity import compare, stats, summarize, truth_definitions
from benchmarks.token_source import (
    DONE,
    FIRST_ID,
    ChunkTemplate,
    Schedule,
    chunk_sizes,
    intervals_ms,
    parse_chunk_pattern,
    serial_from_text,
    token_chunk,
    token_ids,
    token_text,
    usage_chunk,
)
from jobs.request_stream import _handle_event
from records.point import RequestRecord

pytestmark = pytest.mark.unit


def test_schedule_is_absolute_ttft_then_fixed_itl():
    s = Schedule(ttft_s=0.05, itl_s=0.01, tokens=4)
    assert s.offsets_s() == pytest.approx([0.05, 0.06, 0.07, 0.08])
    with pytest.raises(IndexError):
        s.offset_s(4)
    # Waits count from the arrival, not from the previous send: a late token is not
    # carried into the next one.
    assert s.wait_s(0, arrival_s=100.0, now_s=100.0) == pytest.approx(0.05)
    assert s.wait_s(1, arrival_s=100.0, now_s=100.055) == pytest.approx(0.005)
    assert s.wait_s(2, arrival_s=100.0, now_s=100.2) == 0.0  # late: send at once


def test_token_ids_are_deterministic_in_range_and_differ_between_requests():
    a = token_ids(7, 64, vocab_size=512)
    assert a == token_ids(7, 64, vocab_size=512)
    assert len(a) == 64 and min(a) >= FIRST_ID and max(a) < 512
    assert a != token_ids(8, 64, vocab_size=512)


def test_text_names_the_serial():
    text = "".join(token_text(42, k) for k in range(3))
    assert serial_from_text(text) == 42
    assert serial_from_text("something else") is None


def test_chunks_are_vllm_shaped_and_pdbench_parses_them():
    first = token_chunk("r", "m", 0, [9], token_text(0, 0), None, prompt_ids=[5, 6])
    last = token_chunk("r", "m", 0, [10], token_text(0, 1), "length")
    usage = usage_chunk("r", "m", 0, prompt_tokens=2, tokens=2)
    for chunk in (first, last, usage, DONE):
        assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
    choice = json.loads(first[6:])["choices"][0]
    assert choice["token_ids"] == [9] and choice["prompt_token_ids"] == [5, 6]
    assert json.loads(last[6:])["choices"][0]["finish_reason"] == "length"
    assert json.loads(usage[6:])["usage"]["completion_tokens"] == 2
    rec = RequestRecord(0, 1, "agg", 2, 0, [], 0.0, [], 0.0, 0.0)
    counts = [_handle_event(c.strip(), rec) for c in (first, last, usage, DONE)]
    assert counts == [1, 1, 0, 0] and rec.output_token_ids == [9, 10]


def test_template_renders_the_same_bytes_as_token_chunk():
    t = ChunkTemplate("cmpl-7", 'model "quoted" \\ path', 1795383650)
    for ids, text in (([5], token_text(7, 3)), ([511, 4, 9], ' "odd"\ttext\u00e9')):
        assert t.render(ids, text) == token_chunk(
            "cmpl-7", 'model "quoted" \\ path', 1795383650, ids, text, None
        )


def test_chunk_sizes_repeat_the_pattern_and_cut_the_last():
    assert chunk_sizes(5, (1,)) == [1, 1, 1, 1, 1]
    assert chunk_sizes(9, (1, 3, 2)) == [1, 3, 2, 1, 2]
    assert chunk_sizes(2, (4,)) == [2] and chunk_sizes(0, (2,)) == []
    assert parse_chunk_pattern("1,3,2") == (1, 3, 2)
    with pytest.raises(ValueError):
        parse_chunk_pattern("1,0")


def test_errors_are_measured_minus_true():
    truth = {
        "arrival_s": 10.0,
        "due_s": [10.05, 10.06, 10.07],
        "send_s": [10.051, 10.061, 10.072],
        "token_ids": [4, 5, 6],
    }
    assert intervals_ms(truth["send_s"]) == pytest.approx([10.0, 11.0])
    row = compare(51.5, [10.25, 10.5], truth, ids=[4, 5, 6])
    assert row["ttft_error_ms"] == pytest.approx(0.5)
    assert row["itl_error_ms"] == pytest.approx([0.25, -0.5])
    assert row["ids_equal"] is True and row["itl_count_ok"] is True
    assert row["late_ms"] == pytest.approx([1.0, 1.0, 2.0])
    wrong = compare(51.5, [10.0], truth, ids=[4, 5, 7])
    assert wrong["ids_equal"] is False and wrong["itl_count_ok"] is False
    s = summarize([row, wrong], requests=3, failed=["boom"])
    assert s["matched"] == 2 and s["failed"] == 1 and s["ids_equal"] is False
    assert s["itl_count_mismatches"] == 1
    # one gap fewer than the source's: two chunks that arrived in one read
    assert wrong["itl_gaps_merged"] == 1 and s["itl_chunks_merged"] == s["itl_gaps_merged"] == 1
    extra = compare(51.5, [5.0, 5.0, 1.0], truth, ids=[4, 5, 6])  # a gap never sent: an error
    assert extra["itl_count_ok"] is False and extra["itl_gaps_merged"] == 0
    s2 = summarize([row, extra], requests=2, failed=[])
    assert s2["itl_count_mismatches"] == 1 and s2["itl_chunks_merged"] == 0
    assert s["itl_abs_error_ms"]["max"] == pytest.approx(0.5)
    assert stats([])["n"] == 0


def test_tpot_and_e2e_errors_against_the_sources_chunks():
    # Three chunks of 1, 3 and 1 tokens sent at +50, +80, +90 ms.
    truth = {
        "arrival_s": 10.0,
        "due_s": [10.05, 10.08, 10.09],
        "send_s": [10.05, 10.08, 10.09],
        "chunk_tokens": [1, 3, 1],
        "token_ids": [4, 5, 6, 7, 8],
    }
    row = compare(51.0, [30.0, 10.5], truth, tpot_ms=10.5, e2e_ms=92.0)
    assert row["itl_count_ok"] is True and row["itl_error_ms"] == pytest.approx([0.0, 0.5])
    assert row["tpot_error_ms"] == pytest.approx(10.5 - 40.0 / 4)
    assert row["e2e_error_ms"] == pytest.approx(2.0)
    s = summarize([row], requests=1, failed=[])
    assert s["tpot_bias_ms"] == pytest.approx(0.5) and s["e2e_abs_error_ms"][
        "max"
    ] == pytest.approx(2.0)
    one = {**truth, "send_s": [10.05], "due_s": [10.05], "chunk_tokens": [1], "token_ids": [4]}
    d = truth_definitions([truth, one])
    assert d["itl_ms"]["n"] == 2 and d["tpot_ms"]["n"] == 1  # TPOT: requests of 2+ tokens
    assert d["tpot_ms"]["mean"] == pytest.approx(10.0)
    assert d["tokens_per_chunk"] == pytest.approx(6 / 4)
    assert d["e2e_ms"]["mean"] == pytest.approx((90.0 + 50.0) / 2)
