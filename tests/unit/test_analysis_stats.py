"""The statistics core: t quantiles, the Rao-Wu cluster bootstrap and its closed form,
verdicts and the repetitions that would decide them, the saving curve's crossover."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.method.saving_curve import Shape, crossover, fit_curve
from analysis.method.stats import (
    Status,
    bootstrap_interval,
    linear_interval,
    mean_verdict,
    rao_wu_weights,
    repetitions_to_decide,
    replicate_weights,
    satterthwaite,
    t_crit,
    t_quantile,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("df", "q"),
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281), (30, 2.0423)],
)
def test_t_quantiles_match_the_tables(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-4)
    assert t_crit(df) == pytest.approx(q, abs=2e-4)  # the interpolated table
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-4)


def test_t_crit_tends_to_the_normal_and_takes_fractional_df():
    assert t_crit(math.inf) == pytest.approx(1.95996, abs=1e-5)
    assert t_crit(1e6) == pytest.approx(1.96, abs=1e-3)
    assert t_crit(2) > t_crit(2.5) > t_crit(3)
    assert math.isnan(t_crit(0.0))


def test_rao_wu_weights_sum_to_the_stratum_size_and_make_the_variance_unbiased():
    rng = np.random.default_rng(0)
    w = rao_wu_weights(3, 20000, rng)
    assert np.allclose(w.sum(axis=1), 3.0)
    y = np.array([1.0, 2.0, 6.0])
    means = (w * y).sum(axis=1) / 3.0
    # the usual unbiased s^2 / n, not the plain bootstrap's (n - 1) / n of it
    assert means.var() == pytest.approx(y.var(ddof=1) / 3, rel=0.03)
    assert rao_wu_weights(1, 5, rng).tolist() == [[1.0]] * 5  # nothing to resample


def test_bootstrap_matches_the_closed_form_for_a_linear_statistic():
    rng = np.random.default_rng(1)
    strata = np.repeat(np.arange(4), [3, 4, 5, 3])
    y = rng.normal(size=len(strata)) * (1 + strata) + strata
    # the mean of the stratum means: cluster g contributes y_g / (R_s * S)
    sizes = np.bincount(strata)
    contrib = y / sizes[strata] / 4
    closed = linear_interval(contrib, strata)
    boot = bootstrap_interval(lambda w: (w * contrib).sum(axis=1, keepdims=True), strata, 4000)
    assert boot.se[0] == pytest.approx(closed.se[0], rel=0.05)
    assert boot.df[0] == pytest.approx(closed.df[0], rel=0.15)
    assert closed.estimate[0] == pytest.approx(np.mean([y[strata == s].mean() for s in range(4)]))


def test_bootstrap_of_thousands_of_replicates_is_vectorised():
    """A (B, G) weight matrix, not a Python loop per replicate: 2000 x 50."""
    w = replicate_weights(np.repeat(np.arange(10), 5), 2000, seed=3)
    assert w.shape == (2000, 50)
    assert np.allclose(w.reshape(2000, 10, 5).sum(axis=2), 5.0)


def test_bootstrap_resamples_one_stratum_at_a_time_with_the_replicate_weights():
    """``bootstrap_interval`` draws its weights with ``replicate_weights`` (one implementation),
    a stratum's columns at a time, the others as measured; one repetition: a probe only."""
    strata = np.repeat(np.arange(3), [3, 1, 4])
    seen: list[np.ndarray] = []

    def stat(w):
        seen.append(w.copy())
        return w[:, :1]

    spread = bootstrap_interval(stat, strata, 50, seed=2)
    drawn = replicate_weights(strata, 50, seed=2)
    as_measured, first, probe, last = seen
    assert as_measured.tolist() == [[1.0] * 8]
    assert np.array_equal(first[:, :3], drawn[:, :3]) and (first[:, 3:] == 1).all()
    assert probe.tolist() == [[1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0]]
    assert np.array_equal(last[:, 4:], drawn[:, 4:]) and (last[:, :4] == 1).all()
    assert spread.se[0] == pytest.approx(np.std(drawn[:, 0], ddof=1))
    assert not spread.undetermined[0]


def test_satterthwaite_df():
    assert satterthwaite(np.array([1.0, 1.0]), np.array([2, 2])) == pytest.approx(4.0)
    # one stratum dominates: its own df
    assert satterthwaite(np.array([100.0, 1e-9]), np.array([2, 10])) == pytest.approx(2.0)
    assert satterthwaite(np.array([0.0, 0.0]), np.array([2, 2])) == math.inf


def test_mean_verdict_is_the_t_interval():
    v = mean_verdict(np.array([1.0, 2.0, 3.0]))
    assert v.estimate == 2.0 and v.df == 2.0
    assert v.se == pytest.approx(1 / math.sqrt(3))
    assert v.low == pytest.approx(2.0 - 4.3027 / math.sqrt(3), abs=1e-3)
    assert v.status is Status.INCONCLUSIVE
    assert "the 95% interval spans 0" in v.why() and "repetitions" in v.why()
    decided = mean_verdict(np.array([10.0, 11.0, 12.0]))
    assert decided.status is Status.DECIDED and decided.why() == ""
    assert decided.interval() == "+11.0 ms [8.5, 13.5]"
    one = mean_verdict(np.array([5.0]))
    assert one.status is Status.UNDETERMINED and "run 3 or more" in one.why()
    assert one.interval().endswith("[no interval]")


def test_a_positive_difference_is_signed_unless_it_rounds_to_zero():
    def shown(estimate, fmt="{:,.1f}", signed=True):
        return mean_verdict(np.array([estimate] * 3)).interval(fmt, signed).split(" ms")[0]

    assert shown(0.5) == "+0.5"  # not "0.5": the leading 0 is not a sign
    assert shown(0.04) == "0.0"  # rounds to zero: no sign
    assert shown(0.4, "{:,.0f}") == "0"
    assert shown(0.6, "{:,.0f}") == "+1"
    assert shown(0.6, "{:+,.0f}") == "+1"  # a format that signs already: one sign
    assert shown(0.4, "{:+,.0f}") == "0"
    assert shown(12.34) == "+12.3" and shown(-0.5) == "-0.5" and shown(-0.04) == "0.0"
    assert shown(1234.5) == "+1,234.5"
    assert shown(0.5, signed=False) == "0.5"  # a level, not a difference


def test_repetitions_to_decide():
    # se 0.6 at 3 repetitions (sd ~1.04), estimate 1: (t + 0.84) * 1.04 / sqrt(R) <= 1
    r = repetitions_to_decide(1.0, 0.6, 2, 3)
    sd = 0.6 * math.sqrt(3)
    assert (t_crit(r - 1) + 0.8416) * sd / math.sqrt(r) <= 1.0
    assert (t_crit(r - 2) + 0.8416) * sd / math.sqrt(r - 1) > 1.0
    assert repetitions_to_decide(0.0, 1.0, 2, 3) is None  # no effect: no number helps
    assert repetitions_to_decide(0.01, 10.0, 2, 3) is None  # beyond MAX_REPETITIONS
    assert repetitions_to_decide(1.0, 0.1, 2, 1) is None  # spread unknown


def curve_data(saving, histories, reps, noise=0.0, seed=0):
    """Wave means of ``saving(h)`` (+ noise) for ``reps`` repetitions per history."""
    rng = np.random.default_rng(seed)
    x = np.repeat(np.asarray(histories, float), reps)
    y = saving(x) + noise * rng.normal(size=len(x))
    cluster = np.arange(len(x))
    strata = np.repeat(np.arange(len(histories)), reps)
    return x, y, np.ones_like(x), cluster, strata


def test_exact_quadratic_saving_gives_its_root():
    def saving(h):
        return -30.0 + 0.02 * h + 1e-5 * h**2

    root = (-0.02 + math.sqrt(0.02**2 + 4 * 1e-5 * 30)) / (2 * 1e-5)
    curve = fit_curve(*curve_data(saving, (100, 500, 1000, 2000, 3000), 3, noise=1e-6))
    assert curve.degree == 2
    assert curve.root() == pytest.approx(root, rel=1e-4)
    c = crossover(curve)
    assert c.status is Status.DECIDED and c.shape is Shape.CROSSING
    assert c.low <= root <= c.high and c.high - c.low < 50
    assert c.tokens == pytest.approx(root, rel=1e-4)
    assert "95% CI" in c.describe()


def test_noisy_saving_that_cannot_decide_is_inconclusive_with_the_repetitions_needed():
    def saving(h):
        return -10.0 + 0.01 * h

    c = crossover(fit_curve(*curve_data(saving, (200, 600, 1000, 1400, 1800), 3, noise=15)))
    assert c.status is Status.INCONCLUSIVE and not c.decided and c.tokens is None
    assert "leaves the measured range" in c.reason or "holds 0" in c.reason
    assert c.more_repetitions is None or c.more_repetitions > 3
    assert c.describe().startswith("inconclusive")


def test_pull_or_recompute_faster_at_every_length():
    up = crossover(fit_curve(*curve_data(lambda h: 5 + 0.01 * h, (200, 600, 1000), 3, 0.1)))
    assert up.shape is Shape.PULL_EVERYWHERE and up.decided
    assert up.high == 200 and up.low is None and up.covers(50) and not up.covers(500)
    down = crossover(fit_curve(*curve_data(lambda h: -5 - 0.01 * h, (200, 600, 1000), 3, 0.1)))
    assert down.shape is Shape.RECOMPUTE_EVERYWHERE and down.decided and down.covers(5000)


def test_one_repetition_gives_no_interval_and_one_length_no_curve():
    c = crossover(fit_curve(*curve_data(lambda h: -5 + 0.01 * h, (200, 600, 1000), 1, 1.0)))
    assert c.status is Status.UNDETERMINED and "repetition" in c.reason
    assert c.describe().startswith("not determined")
    assert fit_curve(*curve_data(lambda h: h, (500,), 3, 1.0)) is None
    assert crossover(None, "needs both flows").describe() == "n/a (needs both flows)"


def test_a_bounded_quantity_keeps_its_interval_inside_its_range():
    """A share of D's KV near 100% over three repetitions: the t interval crosses 100%;
    ``within`` clips the bounds, not the estimate, and a decision stays what it was."""
    from analysis.method.stats import mean_verdict

    share = mean_verdict(np.array([99.0, 60.0, 98.0]), unit="%")
    assert share.high > 100.0
    clipped = share.within(0.0, 100.0)
    assert (clipped.low, clipped.high) == (max(share.low, 0.0), 100.0)
    assert clipped.estimate == share.estimate and clipped.status is share.status
    held = mean_verdict(np.array([0.1, 0.2, 2.0]), unit="s").within(0.0)
    assert held.low == 0.0 and held.high > 0.2
    assert "[no interval]" in mean_verdict(np.array([5.0]), unit="s").within(0.0).interval()
