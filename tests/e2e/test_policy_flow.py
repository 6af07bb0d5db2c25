"""flow=policy on a real deployment: the router applies a policy.json's rule per turn, pulls
the turns it says pay and recomputes the others, records why, and every turn still gives
agg's greedy tokens."""

from __future__ import annotations

import json

import pytest

from pdbench.results import policy_file
from pdbench.results.interval import Interval
from pdbench.results.policy_file import (
    DeploymentPolicy,
    Policy,
    PullCost,
    RecomputeRate,
    ThresholdBand,
)
from tests.e2e.conftest import NO_PREFLIGHT, outputs_by_turn, request_records, run_pdbench

pytestmark = pytest.mark.e2e

# The smoke deployment (tiny_llama, dram, TP 1->1 on one node, 32-token blocks) with a
# planted cost model: a pull costs P 12 ms, recomputing 0.1 ms a history token, so the rule
# pulls histories above 120 tokens. Turn 2 finds ~80 tokens on D (64 user + 16 output):
# recomputed; turn 3 ~160: pulled.
CROSSOVER = 120


def planted_policy() -> Policy:
    band = ThresholdBand(
        concurrency=1,
        min_concurrency=1,
        max_concurrency=None,
        kv_recompute_threshold=128,
        threshold_interval=Interval(128),
        crossover=Interval(CROSSOVER),
        shape="crossing",
        status="decided",
    )
    entry = DeploymentPolicy(
        deployment_id="planted",
        label="tiny_llama · dram · TP 1->1 · same node (planted)",
        model="tiny_llama",
        transport="dram",
        tp_prefill=1,
        tp_decode=1,
        topology_class="same_node",
        topology_source="placement",
        block_size=32,
        pull_cost=PullCost(Interval(12.0), Interval(0.0)),
        recompute_rate=[RecomputeRate(1, Interval(10_000.0))],
        thresholds=[band],
    )
    return Policy(["planted"], [entry])


def test_the_policy_flow_pulls_what_its_rule_says_and_matches_agg(tmp_path):
    path = policy_file.write(tmp_path / "policy.json", planted_policy())
    run_dir = tmp_path / "run"
    args = [
        "+experiment=smoke",
        "flow=policy",
        f"flow.policy={path}",
        "flow.flows=[agg,recompute,policy]",
        "flow.kv_recompute_threshold=0",
        f"dir={run_dir}",
        "workload.repetitions=1",  # a pipeline test: premises off
        "launch.check_premises=false",
        NO_PREFLIGHT,
    ]
    proc = run_pdbench(args, 1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    points = {p["flow"]: p for p in records}
    assert set(points) == {"agg", "recompute", "policy"}
    assert all(p["status"] == "ok" for p in points.values())
    policy = points["policy"]
    assert outputs_by_turn(run_dir, policy) == outputs_by_turn(run_dir, points["agg"])
    by_turn = {}
    for r in request_records(run_dir, policy):
        by_turn.setdefault(r["turn"], set()).add(r["path"])
    assert by_turn == {1: {"recompute"}, 2: {"recompute_policy"}, 3: {"pull"}}, by_turn
    router = policy["router"]
    assert router["policy"]["path"] == str(path) and router["policy"]["forced"] is False
    assert router["policy"]["rule"] == "cost"
    # the router's record of each turn says which rule decided and on what inputs
    lines = [
        json.loads(line)
        for log in run_dir.glob("logs/*/router_requests.jsonl")
        for line in log.read_text().splitlines()
    ]
    mine = f"pdb-{policy['point_id']}-"  # the Point's requests (not the warm-up's)
    decided = [x for x in lines if x["request_id"].startswith(mine) and x["decision"]]
    assert len(decided) == 2 * 4  # turns 2 and 3 of the 4 conversations
    for x in decided:
        d = x["decision"]
        assert d["rule"] == "cost" and 1 <= d["load"] <= 4 and d["load"] == x["load_in_flight"]
        assert d["history_tokens"] == (x["offered_tokens"] if d["pull"] else x["held_tokens"])
        assert d["pull"] == (d["pull_ms"] < d["recompute_ms"])
        assert d["pull"] == (d["history_tokens"] > CROSSOVER)
        assert x["path"] == ("pull" if d["pull"] else "recompute_policy")
        # a recomputed turn: P computed the whole prompt (nothing pulled)
        if not d["pull"]:
            assert x["offered_tokens"] == 0
