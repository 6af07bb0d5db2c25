"""The policy flow's rule: what a router decides per turn from policy.json (interpolation
between measured loads, clamping outside them, thresholds-only policies), which entry applies
to a deployment, and the files refused before anything starts."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from jobs.serving.sessions import ConversationState
from pdbench.config.schema import Flow, Placement
from pdbench.results import policy_file
from pdbench.results.interval import Interval
from pdbench.results.policy_file import (
    DeploymentPolicy,
    Policy,
    PolicyTarget,
    PullCost,
    RecomputeRate,
    ThresholdBand,
)
from pdbench.results.policy_rule import COST, THRESHOLD, PullRule, interpolate, load_costs
from pdbench.validate.policy import check_policy, warn_policy_forced
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit


def band(c, lo, hi, threshold, status="decided", cost=None) -> ThresholdBand:
    return ThresholdBand(
        concurrency=c,
        min_concurrency=lo,
        max_concurrency=hi,
        kv_recompute_threshold=threshold,
        threshold_interval=Interval(threshold),
        crossover=Interval(threshold),
        shape="crossing" if threshold is not None else "recompute_faster_everywhere",
        status=status,
        pull_cost=cost,
    )


def cost(t0: float, beta: float) -> PullCost:
    return PullCost(Interval(t0), Interval(beta))


def entry(rates=None, bands=None, pull=None, **kw) -> DeploymentPolicy:
    fields = dict(
        deployment_id="dep-1",
        label="tiny_llama · dram · TP 1->1 · same node",
        model="tiny_llama",
        transport="dram",
        tp_prefill=1,
        tp_decode=1,
        topology_class="same_node",
        topology_source="placement",
        block_size=32,
        pull_cost=pull,
        recompute_rate=rates or [],
        thresholds=bands or [],
    )
    return DeploymentPolicy(**{**fields, **kw})


# P recomputes 10,000 history tokens/s at load 1 (0.1 ms each), 2,000/s at load 4 (0.5 ms);
# a pull costs P 10 ms + 0.02 ms per token at load 1, 22 ms + 0.02 at load 4.
LOADED = entry(
    rates=[
        RecomputeRate(1, Interval(10_000.0)),
        RecomputeRate(4, Interval(2_000.0)),
    ],
    bands=[
        band(1, 1, 3, 128, cost=cost(10.0, 0.02)),
        band(4, 4, None, 64, cost=cost(22.0, 0.02)),
    ],
    pull=cost(15.0, 0.02),
)


def crossover(rule: PullRule, load: int) -> int:
    """The shortest history the rule pulls at ``load``."""
    return next(h for h in range(0, 100_000) if rule.decide(h, load).pull)


def test_cost_rule_pulls_from_the_root_of_its_costs_at_each_measured_load():
    rule = PullRule(LOADED)
    assert rule.kind == COST and rule.problem == ""
    # load 1: 10 + 0.02 h < 0.1 h  <=>  h > 125; load 4: 22 + 0.02 h < 0.5 h  <=>  h > 45.8
    assert crossover(rule, 1) == 126
    assert crossover(rule, 4) == 46
    d = rule.decide(200, 1)
    assert d.pull and d.rule == COST and d.load == 1
    assert d.pull_ms == pytest.approx(14.0) and d.recompute_ms == pytest.approx(20.0)
    assert not d.clamped


def test_between_loads_the_per_token_recompute_cost_and_the_pull_cost_interpolate():
    costs = load_costs(LOADED)
    mid, clamped = interpolate(costs, 2.5)
    assert not clamped
    assert mid.ms_per_token == pytest.approx(0.3)  # halfway between 0.1 and 0.5 ms
    assert mid.t0_ms == pytest.approx(16.0)  # halfway between 10 and 22 ms
    rule = PullRule(LOADED)
    assert crossover(rule, 4) < crossover(rule, 3) < crossover(rule, 2) < crossover(rule, 1)


def test_outside_the_measured_loads_the_rule_holds_the_nearest_and_says_so():
    rule = PullRule(LOADED)
    far = rule.decide(50, 64)
    assert far.clamped and far.load == 64
    assert far.recompute_ms == rule.decide(50, 4).recompute_ms  # never extrapolated
    assert rule.decide(50, 0).load == 1  # a load below one counts as this turn alone


def test_without_band_costs_the_fit_over_every_load_prices_the_pull():
    plain = replace(LOADED, thresholds=[band(1, 1, 3, 128), band(4, 4, None, 64)])
    mid = load_costs(plain)
    assert [c.t0_ms for c in mid] == [15.0, 15.0]
    assert crossover(PullRule(plain), 1) == 188  # 15 + 0.02 h < 0.1 h  <=>  h > 187.5


def test_thresholds_only_policy_uses_the_band_in_flight():
    only = entry(bands=[band(1, 1, 3, 128), band(4, 4, None, 64)])
    rule = PullRule(only)
    assert rule.kind == THRESHOLD
    assert [rule.decide(h, 1).pull for h in (127, 128)] == [False, True]
    assert [rule.decide(h, 8).pull for h in (63, 64)] == [False, True]
    assert rule.decide(64, 8).threshold == 64 and not rule.decide(64, 8).clamped


def test_a_band_decided_without_threshold_never_pulls_an_undetermined_one_borrows():
    never = entry(bands=[band(1, 1, 3, None, status="decided")])
    assert not any(PullRule(never).decide(h, 1).pull for h in (0, 100, 10_000))
    mixed = entry(bands=[band(1, 1, 3, 128), band(4, 4, None, None, status="inconclusive")])
    d = PullRule(mixed).decide(200, 6)
    assert d.pull and d.threshold == 128 and d.clamped  # load 1's band, said to be borrowed


def test_an_entry_with_no_rule_says_why():
    empty = entry(bands=[band(1, 1, None, None, status="inconclusive")])
    assert "no cost model" in PullRule(empty).problem
    with pytest.raises(ValueError, match="no cost model"):
        PullRule(empty).decide(100, 1)


def test_the_rule_on_an_analysed_run_switches_where_the_analysis_predicted(tmp_path):
    """policy.json written by the analysis of a synthetic run at three loads: at each measured
    load the router's rule starts pulling at the crossover P's spent costs predicted."""
    from analysis.method.deployment import Context
    from analysis.output import policy as analysis_policy
    from tests.unit.synthetic_loads import at_load, load_run
    from tests.unit.test_analysis_policy import DEP, LENGTHS

    loads = {1: DEP, 4: at_load(DEP, 1.6), 16: at_load(DEP, 2.5)}
    data = load_run(loads, LENGTHS, repetitions=3, noise=0.05, seed=5)
    pol = analysis_policy.policy_of(Context.of(data))
    path = policy_file.write(tmp_path / "policy.json", pol)
    (dep,) = policy_file.read(path).deployments
    rule = PullRule(dep)
    assert rule.kind == COST
    checked = 0
    for b in dep.thresholds:
        if b.predicted is None or b.predicted.value is None:
            continue
        assert crossover(rule, b.concurrency) == pytest.approx(b.predicted.value, rel=0.02, abs=2)
        checked += 1
    assert checked >= 2


TARGET = PolicyTarget("tiny_llama", "dram", 1, 1, "same_node", 32)


def test_the_entry_for_a_deployment_and_what_differs():
    other = replace(LOADED, deployment_id="dep-2", transport="tcp", block_size=16)
    pol = Policy(["/runs/a"], [other, LOADED])
    got, differs = policy_file.entry_for(pol, TARGET)
    assert got is LOADED and differs == []
    got, differs = policy_file.entry_for(Policy(["/runs/a"], [other]), TARGET)
    assert got is other
    assert differs == [
        "transport: policy tcp != deployment dram",
        "block_size: policy 16 != deployment 32",
    ]
    assert policy_file.entry_for(Policy([]), TARGET)[0] is None


def policy_run(tmp_path, pol: Policy | None = None, **flow):
    cfg = cpu_run()
    cfg.flow.flows = [Flow.policy, Flow.pull, Flow.recompute]
    cfg.flow.kv_recompute_threshold = [0]
    if pol is not None:
        dep = replace(
            LOADED,
            model=str(cfg.model.name),
            transport=str(cfg.transport.name),
            tp_prefill=cfg.topology.prefill.tp,
            tp_decode=cfg.topology.decode.tp,
            topology_class=cfg.topology.placement.value,
            block_size=cfg.server.block_size,
        )
        pol = Policy(pol.run_dirs, [dep, *pol.deployments[1:]])
        cfg.flow.policy = str(policy_file.write(tmp_path / "policy.json", pol))
    for key, value in flow.items():
        setattr(cfg.flow, key, value)
    return cfg


def messages(problems) -> str:
    return "\n".join(str(p) for p in problems)


def test_a_policy_for_this_deployment_passes(tmp_path):
    assert check_policy(policy_run(tmp_path, Policy(["/r"], [LOADED]))) == []


def test_missing_malformed_and_newer_policies_are_refused_naming_the_field(tmp_path):
    cfg = policy_run(tmp_path)
    assert "flow.policy='': is empty" in messages(check_policy(cfg))
    cfg.flow.policy = str(tmp_path / "nowhere.json")
    assert "nowhere.json: not a readable policy.json" in messages(check_policy(cfg))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    cfg.flow.policy = str(bad)
    assert "bad.json: not a readable policy.json" in messages(check_policy(cfg))
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"schema_version": 99, "deployments": []}))
    cfg.flow.policy = str(newer)
    text = messages(check_policy(cfg))
    assert "schema_version 99" in text and "Fix: flow.policy=" in text


def test_a_policy_of_another_deployment_is_refused_unless_forced(tmp_path):
    cfg = policy_run(tmp_path, Policy(["/r"], [LOADED]))
    cfg.topology.placement = Placement.cross_node
    text = messages(check_policy(cfg))
    assert "was measured on another deployment" in text
    assert "topology_class: policy same_node != deployment cross_node" in text
    assert "flow.policy_force=true" in text
    cfg.flow.policy_force = True
    assert check_policy(cfg) == []
    assert "runs" in messages(warn_policy_forced(cfg))


def test_p_keeps_no_threshold_of_its_own_under_the_policy(tmp_path):
    cfg = policy_run(tmp_path, Policy(["/r"], [LOADED]), kv_recompute_threshold=[64])
    assert "flow.kv_recompute_threshold=[64]: must be 0 under the policy flow" in messages(
        check_policy(cfg)
    )


def test_a_policy_file_without_the_policy_flow_is_refused(tmp_path):
    cfg = cpu_run()
    cfg.flow.policy = "/x/policy.json"
    assert "no flow applies it" in messages(check_policy(cfg))


def policy_router(tmp_path, pol: Policy, target: PolicyTarget = TARGET, force: bool = False):
    from tests.unit.test_router_logic import router

    path = policy_file.write(tmp_path / "policy.json", pol)
    return router(policy=str(path), policy_target=vars(target), policy_force=force)


def test_the_router_pulls_or_recomputes_as_the_rule_says_at_the_load_in_flight(tmp_path):
    from tests.unit.test_router_logic import HELD, holding, prompt

    r = policy_router(tmp_path, Policy(["/r"], [LOADED]))
    assert r.flow_problem("policy") == ""
    held = len(HELD)  # 70 tokens: recompute at load 1 (from 126), pull at load 4 (from 46)
    alone = r.policy.choose("policy", holding(), prompt(96), now=0.0, load=1)
    busy = r.policy.choose("policy", holding(), prompt(96), now=0.0, load=4)
    assert alone.path == "recompute_policy" and alone.p_params["remote_block_ids"] is None
    assert busy.path == "pull" and busy.offered == held
    assert busy.p_params == {"remote_block_ids": [[1]]}
    assert alone.decision.history_tokens == busy.decision.history_tokens == held
    assert (alone.decision.load, busy.decision.load) == (1, 4)
    # the guards of pull still come first: nothing held, an edited history
    assert r.policy.choose("policy", ConversationState(), prompt(96), 0.0, 4).path == "recompute"
    edited = holding()
    edited.held[3] += 1
    assert r.policy.choose("policy", edited, prompt(96), 0.0, 4).path == "recompute_diverged"
    assert r.stats.diverged == 1


def test_the_router_refuses_a_policy_of_another_deployment_unless_forced(tmp_path):
    pol = Policy(["/r"], [LOADED])
    other = replace(TARGET, block_size=16)
    with pytest.raises(ValueError, match="block_size: policy 32 != deployment 16"):
        policy_router(tmp_path, pol, other)
    forced = policy_router(tmp_path, pol, other, force=True)
    assert forced.loaded_policy.describe()["forced"] is True


def test_the_policy_flow_needs_a_policy_and_d_keeping_its_kv(tmp_path):
    from tests.unit.test_router_logic import router

    assert "without a policy" in router().flow_problem("policy")
    r = policy_router(tmp_path, Policy(["/r"], [LOADED]))
    r.config.bidirectional = False
    assert "does not keep its KV" in r.flow_problem("policy")


def test_static_rules_hold_the_lightest_or_heaviest_band_at_every_load():
    from pdbench.results.policy_rule import STATIC_HEAVY, STATIC_LIGHT, StaticRule, rules_of

    light, heavy = StaticRule(LOADED, STATIC_LIGHT), StaticRule(LOADED, STATIC_HEAVY)
    assert (light.threshold, heavy.threshold) == (128, 64)
    for load in (1, 4, 64):  # whatever the load in flight
        assert [light.decide(h, load).pull for h in (127, 128)] == [False, True]
        assert [heavy.decide(h, load).pull for h in (63, 64)] == [False, True]
    assert heavy.decide(64, 1).rule == STATIC_HEAVY
    # the heaviest band undetermined: the heaviest decided one stands in
    partial = replace(LOADED, thresholds=[LOADED.thresholds[0], band(4, 4, None, None, "x")])
    assert StaticRule(partial, STATIC_HEAVY).threshold == 128
    undecided = replace(LOADED, thresholds=[band(1, 1, None, None, "inconclusive")])
    rules = rules_of(undecided)
    assert rules["policy"].problem == ""  # the cost model still decides
    assert "no decided threshold" in rules[STATIC_LIGHT].problem


def test_the_router_runs_the_static_rules_on_the_same_deployment(tmp_path):
    from tests.unit.test_router_logic import holding, prompt

    r = policy_router(tmp_path, Policy(["/r"], [LOADED]))
    # 70 tokens held: under both thresholds' light one (128), over the heavy one (64)
    light = r.policy.choose("static_light", holding(), prompt(96), now=0.0, load=4)
    heavy = r.policy.choose("static_heavy", holding(), prompt(96), now=0.0, load=1)
    assert (light.path, heavy.path) == ("recompute_policy", "pull")
    assert light.decision.threshold == 128 and heavy.decision.threshold == 64
    assert r.loaded_policy.describe()["static_light"] == 128
    undecided = replace(LOADED, thresholds=[band(1, 1, None, None, "inconclusive")])
    r2 = policy_router(tmp_path, Policy(["/r"], [undecided]))
    assert r2.flow_problem("policy") == ""
    assert "no decided threshold" in r2.flow_problem("static_heavy")
