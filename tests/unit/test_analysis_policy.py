"""policy.json: what a router reads (the threshold per load band, the pull cost, the
recompute rate against load), written beside summary.json, and whatif calibrated by it."""

from __future__ import annotations

import json
import math

import pytest

from analysis import whatif
from analysis.method.deployment import Context
from analysis.output import policy
from analysis.output.wandb_report import summary_metrics
from analysis.pipeline import run_analysis
from testbed.synthetic import Synthetic, SyntheticDeployment, write_records, write_synthetic_run
from tests.unit.synthetic_loads import at_load, load_records, load_run

pytestmark = pytest.mark.unit

DEP = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.04)
LOADS = {1: DEP, 4: at_load(DEP, 1.6), 16: at_load(DEP, 2.5)}
LENGTHS = (128, 256, 512, 768, 1024, 1536, 2048)


def cross_node(point, reqs):
    point["hosts"] = {"prefill0": "gpu-a01 (10.0.0.1)", "decode0": "gpu-a02 (10.0.0.2)"}


@pytest.fixture(scope="module")
def three_loads():
    data = load_run(LOADS, LENGTHS, repetitions=3, noise=0.05, seed=5, edit=cross_node)
    ctx = Context.of(data)
    return ctx, policy.policy_of(ctx)


def test_thresholds_per_band_are_the_per_load_crossovers(three_loads):
    ctx, pol = three_loads
    (a,) = ctx.deployments()
    (dep,) = pol.deployments
    assert [t.concurrency for t in dep.thresholds] == [1, 4, 16]
    seen: list = []
    for band, load in zip(dep.thresholds, a.loads, strict=True):
        c = load.measured.crossover
        assert band.status == "decided" and band.shape == "crossing"
        assert band.crossover.value == c.estimate
        assert (band.crossover.low, band.crossover.high) == (c.low, c.high)
        assert band.kv_recompute_threshold == math.ceil(c.estimate / 16) * 16
        assert band.kv_recompute_threshold == load.threshold_advice.value
        assert band.threshold_interval.low == math.ceil(c.low / 16) * 16
        assert band.validated == load.check.validated
        assert band.predicted.value == load.spent.crossover.value
        # the router's rule at this load flips at the predicted crossover
        h, rate = band.predicted.value, dep.recompute_rate[len(seen)].tokens_per_s.value
        pull = band.pull_cost.t0_ms.value + h * band.pull_cost.beta_ms_per_token.value
        assert pull == pytest.approx(h * 1e3 / rate, rel=1e-9)
        seen.append(band)
    ths = [t.kv_recompute_threshold for t in dep.thresholds]
    assert ths == sorted(ths, reverse=True)  # P recomputes slower under load: pull sooner
    # the bands cover every load: each from its level up to the next one
    assert [(t.min_concurrency, t.max_concurrency) for t in dep.thresholds] == [
        (1, 3), (4, 15), (16, None)
    ]  # fmt: skip
    assert dep.band(1).concurrency == 1 and dep.band(3).concurrency == 1
    assert dep.band(8).concurrency == 4 and dep.band(500).concurrency == 16


def test_the_deployment_is_described_for_a_router(three_loads):
    ctx, pol = three_loads
    (dep,) = pol.deployments
    assert (dep.model, dep.transport, dep.tp_prefill, dep.tp_decode) == ("tiny_llama", "dram", 1, 1)
    # the record's placement says same_node; the hosts the instances ran on say otherwise
    assert (dep.topology_class, dep.topology_source) == ("cross_node", "nodes")
    assert dep.block_size == 16
    assert dep.pull_cost.t0_ms.value == pytest.approx(DEP.alpha_s * 1e3, rel=0.1)
    assert dep.pull_cost.t0_ms.low < dep.pull_cost.t0_ms.value < dep.pull_cost.t0_ms.high
    rates = [r.tokens_per_s.value for r in dep.recompute_rate]
    assert [r.concurrency for r in dep.recompute_rate] == [1, 4, 16]
    assert rates == sorted(rates, reverse=True)
    for r, (conc, d) in zip(dep.recompute_rate, sorted(LOADS.items()), strict=True):
        # the history P recomputes per second at the load's crossover (64 new tokens)
        truth = 1.0 / (d.c1_s + d.c2_s * (2 * 64 + d.exact_crossover()))
        assert r.concurrency == conc and r.tokens_per_s.value == pytest.approx(truth, rel=0.1)
    d = dep.to_dict()
    assert d["measured"] == {
        "crossover": True,
        "pull_cost": True,
        "recompute_rate": True,
        "topology_class": "nodes",
    }


def test_it_round_trips(three_loads, tmp_path):
    _, pol = three_loads
    assert policy.Policy.from_dict(pol.to_dict()) == pol
    path = policy.write(tmp_path / "policy.json", pol)
    assert policy.read(path) == pol
    raw = json.loads(path.read_text())
    assert raw["schema_version"] == policy.SCHEMA_VERSION == 1
    band = raw["deployments"][0]["thresholds"][0]
    assert set(band) >= {"concurrency", "kv_recompute_threshold", "crossover", "status"}
    raw["schema_version"] = 2
    path.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="schema_version 2"):
        policy.read(path)


def test_topology_class_from_hosts_or_placement():
    same = {"prefill0": "n1 (10.0.0.1)", "decode0": "n1 (10.0.0.1)"}
    assert policy.topology_class("cross_node", same) == ("same_node", "nodes")
    apart = {"prefill0": "n1 (10.0.0.1)", "decode0": "n2 (10.0.0.2)"}
    assert policy.topology_class("same_node", apart) == ("cross_node", "nodes")
    assert policy.topology_class("same_node", {}) == ("same_node", "placement")
    ports = {"prefill0": "127.0.0.1:8100", "decode0": "127.0.0.1:8200"}  # address:port
    assert policy.topology_class("cross_node", ports) == ("same_node", "nodes")


def test_analysis_writes_policy_json_beside_summary(tmp_path):
    root = tmp_path / "run"
    items = load_records({1: DEP, 4: LOADS[4]}, LENGTHS, repetitions=3, noise=0.05)
    write_records(root, Synthetic(points=items))
    out = run_analysis([root], tmp_path / "out")
    assert out.policy == tmp_path / "out" / "policy.json"
    assert (tmp_path / "out" / "summary.json").is_file()
    pol = policy.read(out.policy)
    assert [t.concurrency for t in pol.deployments[0].thresholds] == [1, 4]
    deps = out.summary["deployments"]  # one entry per load, each naming it
    assert [d["concurrency"] for d in deps] == [1, 4] and all(d["per_load"] for d in deps)
    metrics = summary_metrics(out)
    assert {k for k in metrics if k.startswith("crossover_tokens/measured/")} == {
        f"crossover_tokens/measured/{deps[0]['deployment_id']}@c{c}" for c in (1, 4)
    }
    # a run with one flow measures no crossover: no policy
    one = [(p, r) for p, r in items if p["flow"] == "pull"]
    write_records(tmp_path / "one", Synthetic(points=one))
    assert run_analysis([tmp_path / "one"], tmp_path / "out1").policy is None
    assert not (tmp_path / "out1" / "policy.json").exists()

    # whatif, calibrated by it: t0 and R_eff measured, the bandwidth given
    args = [f"policy={out.policy}", "bandwidth_gbps=400", "concurrency=6"]
    w, _ = whatif.parse(args)
    dep = pol.deployments[0]
    assert w.shape.name == "tiny_llama"
    assert w.alpha_s == pytest.approx(dep.pull_cost.t0_ms.value / 1e3)
    assert w.prefill_tok_s == dep.recompute_rate[1].tokens_per_s.value  # band 4..: 6 in it
    text = "\n".join(whatif.report(w, [1024]))
    assert "alpha: measured: P's fixed cost per pull, t0" in text
    assert "prefill rate: measured: P's recompute rate R_eff" in text and "concurrency 4" in text
    assert "bandwidth: given (the fabric asked about: not measured)" in text
    assert "<- measured" in text
    # what is given wins over the policy, and says so
    w2, _ = whatif.parse([*args, "alpha_ms=3", "model=llama3_8b"])
    assert w2.alpha_s == pytest.approx(3e-3) and w2.sources["alpha"] == "given"
    assert "rescaled from tiny_llama to llama3_8b" in w2.sources["prefill rate"]
    with pytest.raises(ValueError, match="give policy="):
        whatif.parse(["model=llama3_8b", "bandwidth_gbps=1", "prefill_tok_s=1", "concurrency=4"])
    # a load past the highest measured one: that load's rate, and said so
    far, _ = whatif.parse([f"policy={out.policy}", "bandwidth_gbps=400", "concurrency=100000"])
    assert far.prefill_tok_s == dep.recompute_rate[-1].tokens_per_s.value
    assert (
        "lies above the highest load measured (4): that load's rate is used, not "
        in (far.sources["prefill rate"])
    )
    mid, _ = whatif.parse([f"policy={out.policy}", "bandwidth_gbps=400", "concurrency=2"])
    assert "concurrency 2 was not measured: its band's (1)" in mid.sources["prefill rate"]
    # a policy of one unnamed load (its points name none) knows no load at all
    write_synthetic_run(tmp_path / "unnamed")
    unnamed = run_analysis([tmp_path / "unnamed"], tmp_path / "out_unnamed")
    args = [f"policy={unnamed.policy}", "bandwidth_gbps=400", "concurrency=100000"]
    lone, _ = whatif.parse(args)
    assert "the policy names no load" in lone.sources["prefill rate"]
    assert "concurrency 100000 is not known to it" in lone.sources["prefill rate"]
