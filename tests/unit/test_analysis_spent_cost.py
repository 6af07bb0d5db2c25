"""The cost model from what P spends (the TTFT split): t0 + beta h against h / R_eff(load),
its predicted crossover per load, and whether that lies inside the measured interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.method.deployment import Context
from analysis.method.saving_curve import Crossover, Shape
from analysis.method.spent_cost import Interval, SpentCosts, check, fit_spent, root, spent_frame
from analysis.method.stats import Status
from analysis.questions import crossover
from testbed.synthetic import SyntheticDeployment
from tests.unit.synthetic_loads import at_load, load_run

pytestmark = pytest.mark.unit

DEP = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.04)
LOADS = {1: DEP, 8: at_load(DEP, 2.5)}
LENGTHS = (128, 256, 512, 768, 1024, 1536, 2048)


def test_root_is_where_the_saving_turns_positive():
    # linear: 0.01 ms saved per token, 5 ms fixed: 500 tokens
    assert float(root(0.0, 0.01, -5.0)) == pytest.approx(500.0)
    a, b, c = 1e-6, 0.002, -3.0  # quadratic, tiny a: no cancellation
    expect = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    assert float(root(a, b, c)) == pytest.approx(expect, rel=1e-12)
    assert float(root(0.0, 0.01, 1.0)) == 0.0  # no fixed cost: pull pays from the start
    assert math.isinf(float(root(0.0, -0.01, -5.0)))  # recompute cheaper per token: never
    assert math.isinf(float(root(-1e-3, 0.01, -50.0)))  # attention shrinks it: never reaches 0
    both = root(np.array([0.0, 0.0]), np.array([0.01, 0.02]), np.array([-5.0, -5.0]))
    assert list(both) == pytest.approx([500.0, 250.0])


def test_the_fit_recovers_what_p_spends(tmp_path):
    data = load_run({1: DEP}, LENGTHS, repetitions=3)
    frame = spent_frame(data.requests, set(data.ok_points["point_id"]))
    assert set(frame["flow"]) == {"recompute", "pull"} and (frame["turn"] >= 2).all()
    s = fit_spent(frame, 1)
    u = 64  # the new tokens: computed in both flows
    # t0: what a pull spends at P beyond a recompute, at h = 0: the transfer's alpha
    assert s.t0_ms.value == pytest.approx(DEP.alpha_s * 1e3, rel=0.05)
    r1 = (DEP.c1_s + 2 * DEP.c2_s * u) * 1e3
    assert s.recompute_ms_per_token.value == pytest.approx(r1, rel=0.05)
    assert s.recompute_ms_per_token2 == pytest.approx(DEP.c2_s * 1e3, rel=0.1)
    assert s.shape is Shape.CROSSING
    h = s.crossover.value
    assert h == pytest.approx(DEP.exact_crossover(), rel=0.03)
    assert s.crossover.low < h < s.crossover.high
    # R_eff: history recomputed per second at the crossover, so that a router's rule
    # "pull when t0 + beta h < h / R_eff" flips exactly there
    assert s.tokens_per_s.value == pytest.approx(1e3 / (r1 + DEP.c2_s * 1e3 * h), rel=0.05)
    assert s.tokens_per_s.low < s.tokens_per_s.value < s.tokens_per_s.high
    cost = s.t0_ms.value + s.beta_ms_per_token.value * h
    assert cost == pytest.approx(h * 1e3 / s.tokens_per_s.value, rel=1e-9)


def test_no_split_no_prediction():
    data = load_run({1: DEP}, LENGTHS, repetitions=3)
    req = data.requests.drop(columns=[c for c in data.requests if c.startswith("split_")])
    s = fit_spent(spent_frame(req, set(data.ok_points["point_id"])))
    assert s.shape is Shape.NO_DATA and "TTFT split" in s.describe()


def measured(low, high, shape=Shape.CROSSING, status=Status.DECIDED):
    est = 0.5 * ((low or 100) + high) if shape is Shape.CROSSING else None
    return Crossover(shape, status, est, low, high, 100, 4000)


def predicted(value, shape=Shape.CROSSING):
    i = Interval(value, value * 0.9, value * 1.1) if value else Interval(None)
    return SpentCosts(1, shape, i, Interval(1.0), Interval(0.1), Interval(0.2), 0.0, Interval(5e3))


def test_validated_only_inside_the_measured_interval():
    assert check(predicted(500), measured(450, 560)).validated is True
    out = check(predicted(700), measured(450, 560))
    assert out.validated is False and out.text().startswith("NOT validated (predicted 700 tokens")
    # pull faster at every measured length: a crossover below the shortest is inside
    below = measured(None, 100, Shape.PULL_EVERYWHERE)
    assert check(predicted(60), below).validated is True
    assert check(predicted(None, Shape.PULL_EVERYWHERE), below).validated is True
    assert check(predicted(300), below).validated is False
    above = measured(4000, None, Shape.RECOMPUTE_EVERYWHERE)
    assert check(predicted(None, Shape.RECOMPUTE_EVERYWHERE), above).validated is True
    assert check(predicted(900), above).validated is False
    open_ = measured(None, 560, Shape.CROSSING, Status.INCONCLUSIVE)
    assert check(predicted(500), open_).validated is None


def lying_split(extra_ms: float):
    """P's split says a pull costs ``extra_ms`` more than the TTFT shows (a model that misses)."""

    def edit(point, reqs):
        for r in reqs:
            if r["flow"] == "pull" and r["turn"] >= 2:
                r["ttft_split"] = {**r["ttft_split"], "p_pull_ms": r["ttft_split"]["p_pull_ms"]
                                   + extra_ms}  # fmt: skip

    return edit


def test_per_load_predictions_inside_and_outside_are_reported():
    honest = Context.of(load_run(LOADS, LENGTHS, repetitions=4, noise=0.05, seed=3))
    (a,) = honest.deployments()
    for load in a.loads:
        truth = LOADS[load.concurrency].exact_crossover()
        assert load.spent.crossover.value == pytest.approx(truth, rel=0.1)
        assert load.check.validated is True
    lines = [x.lines()[0] for x in crossover.answer(honest)]
    assert sum("predicted by P's spent costs" in line and ": validated (" in line
               for line in lines) == 2  # fmt: skip
    assert any("inside the measured 95% interval (validated) at concurrency 1, 8" in line
               for line in lines)  # fmt: skip
    lying = Context.of(
        load_run(LOADS, LENGTHS, repetitions=4, noise=0.05, seed=3, edit=lying_split(40.0))
    )
    (b,) = lying.deployments()
    for load, before in zip(b.loads, a.loads, strict=True):
        assert load.measured.crossover.estimate == before.measured.crossover.estimate
        assert load.spent.t0_ms.value == pytest.approx(before.spent.t0_ms.value + 40.0, rel=0.05)
        assert load.spent.crossover.value > load.measured.crossover.high
        assert load.check.validated is False
    text = "\n".join(x.lines()[0] for x in crossover.answer(lying))
    assert text.count(": NOT validated (predicted ") == 2
    assert "outside it at concurrency 1, 8" in text
