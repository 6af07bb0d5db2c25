"""The decode node's bill and the eviction-recovery questions on synthetic records with a
known answer (3 repetitions, seeded noise)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.load.runs import records_to_run_data
from analysis.method.deployment import Context
from analysis.questions import decode_cost, eviction
from testbed.synthetic import REQUEST_FIELDS

pytestmark = pytest.mark.unit

REPS = 3


def point(pid, dep, flow, rep, convs, conc, server=None, bill=None, by_turn=None):
    return {
        "point_id": pid,
        "status": "ok",
        "error": "",
        "flow": flow,
        "deployment": {
            "deployment_id": dep,
            "model": {"name": "tiny"},
            "topology": {"prefill": {"count": 1, "tp": 1}, "decode": {"count": 1, "tp": 1}},
            "transport": {"name": "dram"},
            "server": {"block_size": 32, **(server or {})},
            "kv_recompute_threshold": 32,
        },
        "workload": {
            "kind": "multi_turn",
            "conversations": convs,
            "concurrency": conc,
            "turns": 3,
            "history_tokens": 0,
            "repetition": rep,
        },
        "repetition": rep,
        "decode_bill": bill or {},
        "by_turn": by_turn or [],
    }


def requests(flow, convs, ttft, tpot, path, rng, prompt=100):
    out = []
    for c in range(convs):
        for turn in (1, 2, 3):
            later = turn >= 2
            out.append(
                {
                    **REQUEST_FIELDS,
                    "conversation": c,
                    "turn": turn,
                    "flow": flow,
                    "status": "ok",
                    "prompt_tokens": prompt + 80 * turn,
                    "history_tokens": 80 * (turn - 1),
                    "output_token_ids": [1] * 16,
                    "ttft_ms": (ttft if later else 100.0) + rng.normal(0, 2),
                    "tpot_ms": (tpot if later else 10.0) + rng.normal(0, 0.1),
                    "e2e_ms": 300.0,
                    "start_s": 2.0 * turn + 0.1 * c,
                    "path": path if later else "recompute",
                }
            )
    return out


def test_decode_cost_answers_saving_cost_kv_and_the_ttl_to_run():
    rng = np.random.default_rng(0)
    items = []
    for ttl, dep in ((3, "tiny-ttl3"), (10, "tiny-ttl10")):
        for conc in (1, 4):
            for rep in range(REPS):
                # TTL 3 s is shorter than a conversation's wait at concurrency 1: pulls lost
                lost = ttl == 3 and conc == 1
                for flow in ("pull", "recompute"):
                    pull = flow == "pull"
                    bill = {
                        "blocks": 256,
                        "ttl_s": ttl,
                        "tail_s": ttl + 0.5,
                        "release_s": ttl + 0.2 + rng.normal(0, 0.05),
                        "usage_peak": (0.3 if pull else 0.25) + rng.normal(0, 0.01),
                        "itl_ms_server": (11.0 if pull and conc == 4 else 10.0),
                        "never_pulled_block_s": 4 * ttl * (4 if not pull else 1),
                    }
                    path = ("recompute_expired" if lost else "pull") if pull else "recompute"
                    ttft = 100.0 if lost or not pull else 70.0
                    tpot = 11.0 if pull and conc == 4 else 10.0
                    pid = f"{flow}-{dep}-c{conc}-r{rep}"
                    p = point(pid, dep, flow, rep, 4, conc, bill=bill)
                    items.append((p, requests(flow, 4, ttft, tpot, path, rng)))
    (a,) = decode_cost.answer(Context.of(records_to_run_data(items)))
    assert a.ttl_s == 10.0  # the shortest that lost no pull
    # which load lost them: a long wait between turns (concurrency 1), not every load
    assert "TTL 3 s lost pulls: 100% at " in a.why and ", 0% at " in a.why
    head = a.headline()
    assert head.ttl_s == 10.0 and head.concurrency == 4
    assert head.saving.decided and 27 < head.saving.estimate < 33
    assert head.tpot_cost.decided and 0.9 < head.tpot_cost.estimate < 1.1
    assert head.itl_cost_server.estimate == pytest.approx(1.0)
    assert 28 < head.kv_peak.estimate < 32 and head.kv_peak.unit == "%"
    assert 10.0 < head.held_s.estimate < 10.5
    lost = next(c for c in a.cells if c.ttl_s == 3 and c.concurrency == 1)
    assert lost.lost_pulls == 1.0 and not lost.saving.decided
    line = a.lines()[0]
    assert line.startswith("Decode node's bill: pull saves P +")
    assert "of TTFT and costs D +1.0" in line and "run TTL 10 s" in line
    # one repetition: no interval, and the answer says how many would give one
    one = [(p, r) for p, r in items if p["repetition"] == 0]
    (b,) = decode_cost.answer(Context.of(records_to_run_data(one)))
    assert "[no interval]" in b.lines()[0] and "workload.repetitions" in b.lines()[0]


def test_a_bill_says_when_d_was_not_seen_idle_again_after_some_points():
    """Without flow.kv_tail sampling stops with the load: a Point that ended before D let
    go of its blocks still counts for the KV D used, but says nothing of how long D held
    them, and the answer tells from how many Points the hold time comes."""
    rng = np.random.default_rng(2)
    items = []
    for rep in range(4):
        for flow in ("pull", "recompute"):
            pull = flow == "pull"
            seen = rep < 3  # the last repetition's sampling stopped first
            bill = {
                "blocks": 256,
                "ttl_s": 60,
                "tail_s": 0.5 if seen else -1.0,
                "release_s": 0.4 + rng.normal(0, 0.02) if seen else -1.0,
                "usage_peak": (0.9 if rep == 3 else 0.3) if pull else 0.25,
                "never_pulled_block_s": 10.0,
            }
            path = "pull" if pull else "recompute"
            p = point(f"{flow}-r{rep}", "tiny-ttl60", flow, rep, 4, 4, bill=bill)
            items.append((p, requests(flow, 4, 70.0 if pull else 100.0, 10.0, path, rng)))
    (a,) = decode_cost.answer(Context.of(records_to_run_data(items)))
    (cell,) = a.cells
    assert cell.released == (3, 4)
    assert 0.35 < cell.held_s.estimate < 0.45 and cell.held_s.repetitions == 3
    assert cell.kv_peak.estimate == pytest.approx(45.0)  # every Point's peak, the 4th too
    assert "D was seen idle again after 3 of 4 Points; flow.kv_tail=true" in a.lines()[0]


def turn_rows(hit, pulled, computed):
    return [
        {
            "turn": t,
            "requests": 4,
            "history_tokens_mean": 0,
            "prompt_tokens_mean": 0,
            "ttft_ms_p50": 0,
            "ttft_ms_mean": 0,
            "prefix_hit_tokens": hit if t >= 2 else 0,
            "tokens_pulled": pulled if t >= 2 else 0,
            "prefill_tokens_computed": computed if t >= 2 else 180,
            "bytes_pulled": 0,
        }
        for t in (1, 2, 3)
    ]


def test_eviction_says_from_which_working_set_pulling_pays():
    rng = np.random.default_rng(1)
    server = {"prefill_prefix_caching": True, "prefill_kv_blocks": 128}
    items = []
    for convs, evicted in ((2, False), (4, False), (8, True)):
        for rep in range(REPS):
            for flow in ("pull", "recompute"):
                pull = flow == "pull"
                if not evicted:
                    rows, ttft = turn_rows(160, 0, 64), 80.0
                else:
                    rows = turn_rows(0, 160, 64) if pull else turn_rows(0, 0, 224)
                    ttft = 70.0 if pull else 110.0
                p = point(f"{flow}-c{convs}-r{rep}", "tiny", flow, rep, convs, 4, server)
                p["by_turn"] = rows
                path = "pull" if pull else "recompute"
                items.append((p, requests(flow, convs, ttft, 10.0, path, rng, prompt=500)))
    (a,) = eviction.answer(Context.of(records_to_run_data(items)))
    assert [w.conversations for w in a.sets] == [2, 4, 8]
    assert a.pays_from is not None and a.pays_from.conversations == 8
    assert 37 < a.pays_from.saving.estimate < 43
    # 8 conversations x ceil((500 + 240 + 16) / 32) = 8 x 24 blocks vs 128
    assert a.pays_from.load == pytest.approx(8 * 24 / 128)
    assert a.sets[0].where("pull") == "71%/0%/29%"  # P hits its own cache: nothing to pull
    assert a.sets[-1].shares["pull"]["tokens_pulled"] == pytest.approx(160 / 224)
    assert a.sets[-1].shares["recompute"]["prefill_tokens_computed"] == 1.0
    assert "pays from 8 conversations on (1.5x P's KV cache)" in a.lines()[0]
    # without P's own prefix cache the question is not asked
    for p, _ in items:
        p["deployment"]["server"]["prefill_prefix_caching"] = False
    assert eviction.answer(Context.of(records_to_run_data(items))) == []
