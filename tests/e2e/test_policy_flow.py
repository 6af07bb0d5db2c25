"""flow=policy on a real deployment: the router applies a policy.json's rule per turn, pulls
the turns it says pay and recomputes the others, records why, and every turn still gives
agg's greedy tokens."""

from __future__ import annotations

import json

import pytest

from pdbench.results import policy_file
from pdbench.results.policy_file import PolicyTarget
from tests.e2e.conftest import (
    NO_PREFLIGHT,
    outputs_by_turn,
    request_records,
    run_analysis,
    run_pdbench,
)
from tests.unit.helpers import planted_policy_for

pytestmark = pytest.mark.e2e

# The smoke deployment (tiny_llama, dram, TP 1->1 on one node, 32-token blocks) with a
# planted cost model: a pull costs P 12 ms, recomputing 0.1 ms a history token, so the rule
# pulls histories above 120 tokens. Turn 2 finds ~80 tokens on D (64 user + 16 output):
# recomputed; turn 3 ~160: pulled.
CROSSOVER = 120


def planted_policy(model: str = "tiny_llama", t0_ms: float = 12.0):
    """A policy for the smoke (or policy_check) deployment with a crossover of 10 x t0_ms."""
    return planted_policy_for(PolicyTarget(model, "dram", 1, 1, "same_node", 32), t0_ms)


def router_lines(run_dir) -> list[dict]:
    """Every line of the run's router request logs."""
    return [
        json.loads(line)
        for log in run_dir.glob("logs/*/router_requests.jsonl")
        for line in log.read_text().splitlines()
    ]


def test_the_policy_flow_pulls_what_its_rule_says_and_matches_agg(tmp_path):
    """In an open loop (Poisson arrivals, the same offered times in every flow)."""
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
        "workload.arrival=poisson",
        "workload.request_rate=4",
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
    # open loop: every flow offered the same turns at the same times, and says what it took
    offered = {
        flow: {(r["conversation"], r["turn"]): r["offered_s"] for r in request_records(run_dir, p)}
        for flow, p in points.items()
    }
    assert offered["policy"] == offered["agg"] == offered["recompute"]
    assert len(offered["policy"]) == 12 and min(offered["policy"].values()) == 0.0
    for p in points.values():
        load = p["offered_load"]
        assert load["offered_rate"] == 4.0 and load["achieved_rate"] > 0
        assert 0.0 <= load["late_share"] <= 1.0 and isinstance(load["kept_up"], bool)
    by_turn = {}
    for r in request_records(run_dir, policy):
        by_turn.setdefault(r["turn"], set()).add(r["path"])
    assert by_turn == {1: {"recompute"}, 2: {"recompute_policy"}, 3: {"pull"}}, by_turn
    router = policy["router"]
    assert router["policy"]["path"] == str(path) and router["policy"]["forced"] is False
    assert router["policy"]["rule"] == "cost"
    # the router's record of each turn says which rule decided and on what inputs
    lines = router_lines(run_dir)
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


def test_policy_check_pipeline_measures_every_rule_and_answers_with_verdicts(tmp_path):
    """The policy_check preset, small, with a planted policy for its deployment (cpu_llama):
    the policy pulls some turns and recomputes others as its rule says, the static rules
    hold their threshold whatever the load, every flow gives agg's tokens, and the analysis
    answers policy vs the best static rule per load with the flows' pulled shares."""

    path = policy_file.write(tmp_path / "policy.json", planted_policy("cpu_llama", 19.2))
    run_dir = tmp_path / "run"
    args = [
        "+experiment=policy_check",
        f"flow.policy={path}",
        "flow.flows=[agg,static_light,static_heavy,policy]",
        f"dir={run_dir}",
        "workload.conversations=4",
        "workload.concurrency=[1,4]",
        "workload.repetitions=2",
        "launch.check_premises=false",
        NO_PREFLIGHT,
    ]
    proc = run_pdbench(args, 1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    assert len(records) == 4 * 2 * 2 and all(p["status"] == "ok" for p in records)
    by_key = {(p["flow"], p["workload"]["concurrency"], p["repetition"]): p for p in records}
    paths: dict[str, set] = {}
    for (flow, load, rep), point in by_key.items():
        agg = outputs_by_turn(run_dir, by_key[("agg", load, rep)])
        assert outputs_by_turn(run_dir, point) == agg, (flow, load, rep)
        for r in request_records(run_dir, point):
            if r["turn"] >= 2:
                paths.setdefault(flow, set()).add(r["path"])
    # crossover 192 tokens (19.2 ms / 0.1 ms a token): histories spread from ~40 to ~600
    assert {"pull", "recompute_policy"} <= paths["policy"], paths
    # one band, threshold 128: the static rules are the same rule here, at every load
    assert paths["static_light"] == paths["static_heavy"]
    lines = router_lines(run_dir)
    static = [x for x in lines if x["decision"].get("rule") in ("static_light", "static_heavy")]
    assert static and all(
        x["decision"]["pull"] == (x["decision"]["history_tokens"] >= 128) for x in static
    )
    cards = run_analysis(run_dir)
    assert cards.returncode == 0, cards.stdout[-3000:] + cards.stderr[-3000:]
    assert "the policy vs the best static rule" in cards.stdout  # its card, by default
    analysed = run_analysis(run_dir, "--details")
    assert analysed.returncode == 0, analysed.stdout[-3000:] + analysed.stderr[-3000:]
    out = analysed.stdout
    assert "the policy vs the best static rule" in out
    assert "over all loads TTFT p90 " in out and "; goodput " in out
    assert "at concurrency 1: TTFT p90 " in out and "at concurrency 4: TTFT p90 " in out
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    (check,) = summary["questions"]["policy_check"]
    verdicts = {c["verdict"] for c in check["comparisons"]}
    assert verdicts <= {"better", "as good", "worse", "undecided"}
    assert (run_dir / "analysis" / "policy_check.png").exists()
