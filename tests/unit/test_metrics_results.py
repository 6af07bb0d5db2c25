import json

import pytest

from jobs.measure import attribution, metrics
from pdbench.results.store import RunStore, write_json_atomic
from records.point import PointResult, RequestRecord

pytestmark = pytest.mark.unit

SAMPLE = """# HELP vllm:prompt_tokens_by_source_total x
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 65.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 71.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 393216.0
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 2.0
vllm:nixl_bytes_transferred_bucket{engine="0",le="1e6",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:unrelated_total 5
"""


def test_parse_and_delta():
    after = metrics.parse_prometheus(SAMPLE)
    assert metrics.tokens_by_source(after, "local_compute") == 65.0
    assert metrics.nixl_bytes(after) == 393216.0
    assert not any("bucket" in k for k in after) and "vllm:unrelated_total" not in after
    before = {"vllm:nixl_bytes_transferred_sum": 100.0, "vllm:kv_cache_usage_perc": 0.9}
    d = metrics.delta(before, after)
    assert d["vllm:nixl_bytes_transferred_sum"] == 393116.0
    assert d["vllm:kv_cache_usage_perc"] == 0.25  # a gauge keeps its value


def test_the_servers_itl_and_tpot_histograms_are_kept_as_sum_and_count():
    text = """vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.9
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 90.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.2
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 20.0
"""
    before = {f"{metrics.ITL_SECONDS}_sum": 0.1, f"{metrics.ITL_SECONDS}_count": 20.0}
    d = metrics.delta(before, metrics.parse_prometheus(text))
    assert metrics.histogram_mean_ms(d, metrics.ITL_SECONDS) == pytest.approx(10.0)
    assert metrics.histogram_mean_ms(d, metrics.TPOT_SECONDS) == pytest.approx(10.0)
    assert metrics.histogram_mean_ms({}, metrics.TPOT_SECONDS) == 0.0


def test_transfer_totals_count_failed_and_late_reads_over_instances():
    deltas = {
        "prefill0": {
            "vllm:nixl_bytes_transferred_sum": 100.0,
            "vllm:nixl_num_failed_transfers_total": 2.0,
            "vllm:nixl_num_notifications_after_expiry_total": 1.0,
        },
        "decode0": {
            "vllm:nixl_bytes_transferred_sum": 50.0,
            "vllm:nixl_xfer_time_seconds_count": 3,
        },
    }
    t = attribution.transfer_totals(deltas)
    assert (t.bytes, t.count, t.failed, t.read_after_expiry) == (150.0, 3.0, 2.0, 1.0)


def test_turn_row_attributes_by_role():
    deltas = {
        "prefill0": metrics.parse_prometheus(SAMPLE),
        "decode0": {"vllm:prompt_tokens_by_source_total[external_kv_transfer]": 999.0},
    }
    recs = [
        RequestRecord(
            c, 2, "pull", 136, 72, [1], 10.0 * (c + 1), [], 50.0, 0.0, path="pull",
            prefill_ms=4.0 * (c + 1),
        )
        for c in range(2)
    ]  # fmt: skip
    row = attribution.turn_row(2, recs, deltas, ["prefill0"], ["prefill0"])
    assert row.prefill_tokens_computed == 32.5 and row.tokens_pulled == 35.5
    assert row.bytes_pulled == 393216.0 and row.paths == {"pull": 2}
    assert row.ttft_ms_p50 == 15.0
    assert row.prefill_ms_p50 == 6.0  # P's share of the turn's TTFT, as the router saw it
    agg = [RequestRecord(0, 1, "agg", 64, 0, [1], 9.0, [], 20.0, 0.0, path="agg")]
    assert attribution.turn_row(1, agg, deltas, [], ["prefill0"]).prefill_ms_p50 == -1.0


def test_turn_row_keeps_nixl_seconds_and_counts_per_instance():
    deltas = {
        "prefill0": {
            "vllm:nixl_bytes_transferred_sum": 4096.0,
            "vllm:nixl_xfer_time_seconds_sum": 0.002,
            "vllm:nixl_xfer_time_seconds_count": 2.0,
        },
        "decode0": {
            "vllm:nixl_bytes_transferred_sum": 8192.0,
            "vllm:nixl_xfer_time_seconds_sum": 0.003,
            "vllm:nixl_xfer_time_seconds_count": 2.0,
        },
        "agg0": {"vllm:prompt_tokens_total": 5.0},  # read nothing: no entry
    }
    recs = [RequestRecord(0, 2, "pull", 100, 60, [1], 10.0, [], 20.0, 0.0)]
    row = attribution.turn_row(2, recs, deltas, ["prefill0"], ["prefill0"])
    assert row.nixl == {
        "prefill0": {"bytes": 4096.0, "seconds": 0.002, "count": 2.0},  # P<-D pulls
        "decode0": {"bytes": 8192.0, "seconds": 0.003, "count": 2.0},  # D<-P reads
    }
    assert row.bytes_pulled == 4096.0  # unchanged: P's reads only


def test_turn_row_split_means_and_sources():
    recs = [RequestRecord(c, 2, "pull", 100, 60, [1], 10.0, [], 20.0, 0.0) for c in range(3)]
    recs[0].ttft_split, recs[0].split_source = {"router_ms": 1.0, "residual_ms": 9.0}, "per_request"
    recs[1].ttft_split, recs[1].split_source = {"router_ms": 3.0, "residual_ms": 7.0}, "per_request"
    row = attribution.turn_row(2, recs, {}, [], [])
    attribution.add_split(row, recs)
    assert row.ttft_split_mean == {"router_ms": 2.0, "residual_ms": 8.0}
    assert row.split_sources == {"per_request": 2}


def test_percentiles_and_summary_count_failures():
    assert attribution.percentile([1, 2, 3, 4], 50) == 2.5
    recs = [
        RequestRecord(0, 1, "agg", 1, 0, [1, 2], 5.0, [1.0], 9.0, 0.0),
        RequestRecord(1, 1, "agg", 1, 0, [], 0.0, [], 9.0, 0.0, status="failed", error="x"),
    ]
    s = attribution.summarize(recs, duration_s=2.0)
    assert (s.requests, s.failed_requests, s.output_tokens) == (2, 1, 2)
    assert s.throughput_tok_s == 1.0


def test_summary_itl_over_chunk_gaps_tpot_over_requests_of_two_tokens_or_more():
    def rec(tokens, chunks, itl, tpot):
        return RequestRecord(
            0, 1, "pull", 8, 0, list(range(tokens)), 5.0, itl, 0.0, 0.0,
            chunk_tokens=chunks, tpot_ms=tpot,
        )  # fmt: skip

    recs = [
        rec(4, [1, 3], [9.0], 3.0),  # one gap for a chunk of 3 tokens: no zeros
        rec(3, [1, 1, 1], [2.0, 4.0], 5.0),
        rec(1, [1], [], 0.0),  # one token: no TPOT
    ]
    s = attribution.summarize(recs, duration_s=1.0)
    assert s.itl_ms.p50 == 4.0 and s.itl_ms.mean == pytest.approx(5.0)
    assert s.tpot_ms.mean == 4.0 and s.tpot_ms.p50 == 4.0  # two requests, not three
    assert s.tokens_per_chunk_mean == pytest.approx(8 / 6)


def test_store_writes_atomically_and_reads_back(tmp_path):
    store = RunStore(tmp_path)
    assert store.point_status("p1") == "pending"
    rec = RequestRecord(0, 1, "agg", 3, 0, [4, 5], 1.0, [2.0], 3.0, 0.0)
    store.write_point(PointResult("p1", "ok", "", "agg", {"deployment_id": "d"}, {}), [rec])
    assert store.point_status("p1") == "ok"
    assert store.read_requests("p1") == [rec]  # read back into its type
    assert store.read_point("p1").requests_file == "requests/p1.jsonl"
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]  # no temp files left


def test_atomic_write_keeps_old_file_when_serialisation_fails(tmp_path):
    path = tmp_path / "x.json"
    write_json_atomic(path, {"v": 1})

    class Boom:
        def __str__(self):
            raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        write_json_atomic(path, {"v": Boom()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]
