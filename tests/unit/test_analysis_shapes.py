"""No crash on any shape the saving can take: rising, falling, flat, U-shaped, stepped, one
length, one repetition, no noise or a lot of it. A seeded loop over random shapes through
the curve, the crossover verdict, the threshold advice and their texts; and whole runs with
a falling and a flat saving through ``python -m analysis``'s pipeline."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from analysis.method.deployment import advise_threshold
from analysis.method.pull_recompute import Measured
from analysis.method.saving_curve import EQUIVALENCE_SHARE, Shape, crossover, fit_curve
from analysis.method.stats import Status
from analysis.pipeline import run_analysis
from testbed.synthetic import Noise, SyntheticDeployment, synthetic_records, write_records

pytestmark = pytest.mark.unit

SHAPES = 400


def random_saving(rng: np.random.Generator):
    """A saving s(h) in ms of a random kind, scaled to ``size`` ms."""
    kind = rng.integers(0, 7)
    size = 10 ** rng.uniform(-1, 3)
    root = rng.uniform(-500, 3000)
    if kind == 0:  # rising through a root
        return lambda h: size * (h - root) / 1000
    if kind == 1:  # falling through a root
        return lambda h: -size * (h - root) / 1000
    if kind == 2:  # flat (0 or a constant)
        level = size * rng.choice([0.0, 1.0, -1.0])
        return lambda h: level + 0 * h
    if kind == 3:  # a U or an arch through two roots
        sign = rng.choice([-1.0, 1.0])
        return lambda h: sign * size * ((h - 1000) ** 2 / 1e6 - 0.2)
    if kind == 4:  # a step per 512-token chunk on a line
        return lambda h: size * (np.floor(h / 512) - 1.5)
    if kind == 5:  # saturating
        return lambda h: size * (1 - np.exp(-h / 400)) - size / 2
    c = rng.normal(size=4)  # a random cubic
    return lambda h: (
        size * (c[0] + c[1] * h / 1000 + c[2] * (h / 1000) ** 2 + c[3] * (h / 1e3) ** 3)
    )


def random_curve(rng: np.random.Generator):
    lengths = np.unique(rng.choice([0, 32, 128, 256, 512, 1024, 2048, 4096], rng.integers(1, 7)))
    reps = int(rng.integers(1, 5))
    saving = random_saving(rng)
    x = np.repeat(lengths.astype(float), reps)
    noise = rng.choice([0.0, 1e-9, 1.0, 100.0])
    y = saving(x) + noise * rng.standard_normal(len(x))
    cluster = np.arange(len(x))
    strata = np.repeat(np.arange(len(lengths)), reps)
    weight = rng.choice([1.0, 1e-4]) * np.ones(len(x))
    return fit_curve(x, y, weight, cluster, strata)


def test_every_random_shape_gives_a_verdict_and_words():
    rng = np.random.default_rng(2026)
    seen = set()
    for _ in range(SHAPES):
        curve = random_curve(rng)
        c = crossover(curve, "" if curve is not None else "one history length")
        seen.add((c.shape, c.status))
        for text in (c.describe(), c.short(), c.interval_text() if c.lo is not None else ""):
            assert "nan" not in text and "None" not in text, text
        json.dumps(c.to_dict(), allow_nan=False)
        advice = advise_threshold(Measured(curve=curve, crossover=c), 16)
        assert "nan" not in advice.text() and "None" not in advice.text()
        if c.decided and c.shape in (Shape.CROSSING, Shape.FALLING):
            lo = c.low if c.low is not None else c.lo
            hi = c.high if c.high is not None else c.hi
            assert c.estimate is not None and lo <= c.estimate <= hi
        # faster everywhere: the band excludes the other flow being slower by more than the
        # equivalence margin (as fast within it where the band holds 0), at every length
        margin = EQUIVALENCE_SHARE * curve.level if curve is not None else 0.0
        if c.decided and c.shape is Shape.PULL_EVERYWHERE:
            assert (curve.low >= -margin).all() and (curve.low > 0).any()
        if c.decided and c.shape is Shape.RECOMPUTE_EVERYWHERE:
            assert (curve.high <= margin).all() and (curve.high < 0).any()
        if c.decided and c.shape is not Shape.CROSSING:
            assert c.tokens is None  # a threshold is set from a rising crossing only
    # the loop reached the shapes it is about
    for want in (
        (Shape.CROSSING, Status.DECIDED),
        (Shape.FALLING, Status.DECIDED),
        (Shape.MIXED, Status.DECIDED),
        (Shape.PULL_EVERYWHERE, Status.DECIDED),
        (Shape.RECOMPUTE_EVERYWHERE, Status.DECIDED),
        (Shape.CROSSING, Status.INCONCLUSIVE),
        (Shape.CROSSING, Status.UNDETERMINED),
        (Shape.NO_DATA, Status.UNDETERMINED),
    ):
        assert want in seen, want


def test_a_falling_saving_is_a_decided_crossing_downwards():
    """y = 50 - 0.05 h: pull faster below 1,000 tokens (was: estimate None, a TypeError)."""
    x = np.repeat([200.0, 600, 1000, 1400, 1800], 3)
    y = 50 - 0.05 * x + np.random.default_rng(0).normal(size=15)
    c = crossover(fit_curve(x, y, np.ones(15), np.arange(15), np.repeat(np.arange(5), 3)))
    assert c.shape is Shape.FALLING and c.decided
    assert c.estimate == pytest.approx(1000, abs=40) and c.low <= c.estimate <= c.high
    assert c.describe().startswith("pull faster below 1,0")
    advice = advise_threshold(Measured(crossover=c), 16)
    assert advice.value is None and "no value of it matches" in advice.text()


def test_a_band_that_touches_zero_without_a_change_of_sign_is_no_crossing():
    """Recompute faster at both ends, the band holding 0 in the middle only: inconclusive."""
    x = np.repeat([200.0, 600, 1000, 1400, 1800], 3)
    curve = fit_curve(x, -10 + 0 * x, np.ones(15), np.arange(15), np.repeat(np.arange(5), 3))
    middle = (curve.grid > 800) & (curve.grid < 1200)
    curve = replace(curve, low=curve.fit - 1, high=np.where(middle, 20.0, curve.fit + 1))
    c = crossover(curve)
    assert c.status is Status.INCONCLUSIVE and "without a decided change of sign" in c.reason
    assert c.segments[0][0] == -1 and c.segments[-1][0] == -1 and not c.decided


def shaped_run(root, saving_ms, histories=(64, 256, 512, 1024, 2048), reps=4):
    """A synthetic run whose pull at turn 2 is its recompute twin less ``saving_ms(h)``."""
    dep = SyntheticDeployment()
    syn = synthetic_records([dep], histories=histories, turns=2, conversations=2,
                            flows=("recompute", "pull"), noise=Noise.realistic(),
                            repetitions=reps, seed=3)  # fmt: skip
    twin = {
        (p["workload"]["history_tokens"], p["repetition"], r["conversation"]): r["ttft_ms"]
        for p, reqs in syn.points
        if p["flow"] == "recompute"
        for r in reqs
        if r["turn"] == 2
    }
    for p, reqs in syn.points:
        for r in reqs if p["flow"] == "pull" else []:
            if r["turn"] == 2:
                key = (p["workload"]["history_tokens"], p["repetition"], r["conversation"])
                r["ttft_ms"] = twin[key] - saving_ms(r["history_tokens"]) * (1 + 0.01 * key[1])
    write_records(root, syn)
    (root / "manifest.json").write_text(json.dumps({"name": "shaped", "deployments": []}))
    return run_analysis([root], root / "analysis")


@pytest.mark.parametrize(
    ("name", "saving", "shape"),
    [
        ("falling", lambda h: 40.0 - 0.04 * h, Shape.FALLING),
        ("flat", lambda h: 0.0 * h, None),
        ("one length", None, None),
    ],
)
def test_whole_runs_of_any_shape_are_answered_in_words(tmp_path, name, saving, shape):
    if saving is None:
        out = shaped_run(tmp_path / "r", lambda h: 5.0, histories=(512,))
    else:
        out = shaped_run(tmp_path / "r", saving)
    text = "\n".join(out.summary["answer"])
    assert "nan" not in text and "None" not in text, text
    if name == "one length":  # the design measures no crossover: a note says why, no verdict
        assert "no crossover: every turn measured one history length" in text, text
        json.dumps(out.summary, allow_nan=False)
        return
    cross = out.summary["questions"]["crossover"][0]["measured"]
    if shape is not None:
        assert cross["shape"] == shape.value and cross["verdict"] == "decided"
        assert "pull faster below" in text
    json.dumps(out.summary, allow_nan=False)


def test_pull_as_fast_within_the_margin_at_the_short_end_is_decided_pull_everywhere():
    """A saving of 0 at the shortest length (the band holds 0 there, within 5% of TTFT),
    pull decidedly faster beyond: pull is as fast or faster everywhere; the same line
    shifted so that recompute is 12% faster at the shortest length is a crossing."""
    x = np.repeat(np.array([50.0, 100, 400, 1600, 4000]), 8)
    rng = np.random.default_rng(7)
    level = 200.0 + x  # ms
    strata = np.repeat(np.arange(5), 8)
    for zero_at, shape in ((50.0, Shape.PULL_EVERYWHERE), (150.0, Shape.CROSSING)):
        y = 0.3 * (x - zero_at) + 0.01 * level * rng.standard_normal(len(x))
        c = crossover(fit_curve(x, y, 1.0 / level**2, np.arange(len(x)), strata))
        assert c.shape is shape and c.decided, (zero_at, c.describe())
        if shape is Shape.PULL_EVERYWHERE:
            assert "within 5% of TTFT" in c.reason


def test_an_undecided_long_end_above_pull_faster_does_not_open_a_rising_crossing():
    """Recompute decided faster at the short end, pull from the middle on, the longest
    lengths too noisy for the band: the crossing's interval ends where pull became faster."""
    x = np.repeat(np.array([50.0, 100, 200, 400, 800, 8000]), 6)
    rng = np.random.default_rng(3)
    level = 200.0 + x
    noise = np.where(x >= 8000, 0.9, 0.02) * level * rng.standard_normal(len(x))
    y = 0.5 * (x - 150) + noise
    strata = np.repeat(np.arange(6), 6)
    c = crossover(fit_curve(x, y, 1.0 / level**2, np.arange(len(x)), strata))
    assert c.shape is Shape.CROSSING and c.high is not None and c.high < 8000, c.describe()
