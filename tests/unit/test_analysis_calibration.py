"""The statistics are tested, not trusted: on seeded synthetic runs with realistic noise and
a known truth, 95% intervals cover the truth about 95% of the time.

Each run: one deployment, pull and recompute, 5 history lengths x 3-5 repetitions x 2-4
conversations, two turns (turn 1: the A/A control; turn 2: history = length + 80), Points in
a seeded random order, and ``Noise.realistic()``: heavy-tailed per-request noise (~35%),
a shared factor per wave (batched requests) and per Point, a slow drift over the run order
and a factor for the whole run (identical runs ~2x apart). The records go through the same
path as ``python -m analysis`` (``records_to_run_data`` -> ``request_frame`` ->
``pull_recompute.measure``), without writing files.

Tolerances, from the nominal rate and the number of runs: a rate observed over ``n``
independent trials whose true rate is ``p`` has a standard deviation ``sqrt(p (1 - p) / n)``;
every band is 3 of them (``stats.rate_tolerance``), so a calibrated method fails a given
bound about once in 740 runs of the test. At ``RUNS`` = 210 and 95%, 3 sigma is 4.5 points:

- the crossover's interval covers the truth in at least 95% - 4.5 = 90.5% of the runs. It is
  conservative by construction (it holds every length where the band holds 0, and reaches
  the measured range's end when open), so no upper bound: the band's and the decided
  share's bounds catch an interval too wide;
- the band at the true crossover (a pointwise 95% t interval) covers it in 90.5-99.5%: an
  interval too narrow fails below, one so wide it always covers above;
- decided runs: there is no nominal rate, so the floor comes from what this design
  measured, about half the runs (106 of seeds 0-209; 331 of seeds 0-629): 50% less 3 sigma
  at 210 runs (10.3 points), 39.7%. An always-inconclusive interval, covering trivially,
  fails it. The decided runs' own coverage: 95% less 3 sigma over their number;
- A/A (``EQUAL``): the 5 lengths of a run are called equal at 95%. A run's cells share its
  scale, drift and Points' order, so they need not be independent: the sigma counts the
  runs, not the 1,050 cells (a bound whatever the correlation: 5 cells of one run spread at
  most as one trial), 90.5-99.5%. Decided crossings: at most 5% + 4.5 points. The A/A
  control, one per run, is significant in 5% +- 4.5 points, 0.5-9.5%: a control that never
  fires fails, as does one firing twice as often as it should;
- the interval without the repetition level (below) must fail the crossover's and the
  band's floors, and one twice as wide the band's ceiling and the decided share's floor.

Measured (seeds 0-209): crossover interval covers 99.0%, band 98.1%, 106 runs decided (98.1%
of them cover); without the repetition level 83.3% and 82.9%; twice as wide 100% and 100%,
8 decided; A/A: cells equal 95.1%, no decided crossing, control significant 2.4%. Over
seeds 0-629: 97.3%, 96.7%, 52.5% decided (95.2% cover), 78.1% and 77.1%, 95.6% equal (its
spread over runs, 0.36 points, about the 0.37 of independent cells), 0.3% crossings,
control 2.5%.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from analysis.load import records_to_run_data
from analysis.pairs import STRATUM, cluster_index, request_frame
from analysis.pull_recompute import measure, wave_weights
from analysis.report import STATISTICS
from analysis.saving_curve import Shape, crossover, fit_curve
from analysis.stats import CALIBRATION_RUNS as RUNS
from analysis.stats import LEVEL
from analysis.stats import rate_tolerance as tol
from analysis.synthetic import Noise, SyntheticDeployment, synthetic_records

pytestmark = pytest.mark.unit

ALPHA = 1.0 - LEVEL
COVERED = LEVEL - tol(LEVEL, RUNS)  # the floor of a conservative interval's coverage
NOMINAL = (LEVEL - tol(LEVEL, RUNS), LEVEL + tol(LEVEL, RUNS))  # an exact interval's
FALSE_ALARMS = (ALPHA - tol(ALPHA, RUNS), ALPHA + tol(ALPHA, RUNS))  # the A/A control's
DECIDED = 0.5  # this design decides about half the runs (measured: the docstring)
HISTORIES = (128, 512, 1024, 1536, 2048)
# a pull with a 40 ms fixed cost: recompute wins at short histories, pull above ~881 tokens
CROSSING = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.04)
# pulling h tokens costs exactly what computing them does: pull == recompute at every length
EQUAL = SyntheticDeployment(c2_s=0.0, alpha_s=0.0, beta_bytes_per_s=1024 / 2e-5)


def design(seed: int) -> dict:
    return {
        "repetitions": 3 + seed % 3,
        "conversations": 2 + (seed // 3) % 3,
        "seed": seed,
    }


def run(dep: SyntheticDeployment, seed: int):
    syn = synthetic_records(
        [dep],
        histories=HISTORIES,
        turns=2,
        flows=("recompute", "pull"),
        noise=Noise.realistic(),
        traces=False,
        **design(seed),
    )
    return request_frame(records_to_run_data(syn.points))


@pytest.fixture(scope="module")
def crossing_runs():
    return [(seed, run(CROSSING, seed)) for seed in range(RUNS)]


def test_the_truth_is_what_the_generator_says():
    truth = CROSSING.exact_crossover()
    assert CROSSING.saving_s(truth) == pytest.approx(0.0, abs=1e-12)
    assert truth == pytest.approx(881, abs=1)
    assert EQUAL.saving_s(300) == pytest.approx(0.0, abs=1e-12)
    assert EQUAL.saving_s(3000) == pytest.approx(0.0, abs=1e-12)


def band_covers(curve, truth: float) -> bool:
    """Does the saving's 95% band hold 0 at the true crossover (where the true saving is 0
    whatever the run's scale)? The crossover's interval is read off this band."""
    i = int(np.searchsorted(curve.grid, truth))
    return bool(curve.low[i] <= 0 <= curve.high[i])


def test_the_bands_follow_from_the_nominal_rate_and_the_runs():
    assert RUNS == 210 and LEVEL == 0.95
    assert tol(LEVEL, RUNS) == pytest.approx(3 * 0.01504, abs=1e-4)
    assert pytest.approx(0.905, abs=5e-4) == COVERED
    assert pytest.approx((0.905, 0.995), abs=5e-4) == NOMINAL
    assert pytest.approx((0.005, 0.095), abs=5e-4) == FALSE_ALARMS
    assert DECIDED - tol(DECIDED, RUNS) == pytest.approx(0.3965, abs=5e-4)
    text = " ".join(STATISTICS.split())  # the report quotes them
    assert f"on {RUNS} seeded" in text and f"at least {COVERED:.1%}" in text


def check_calibration(verdicts, curves, truth, label):
    covered = np.mean([c.covers(truth) for c in verdicts])
    band = np.mean([band_covers(c, truth) for c in curves])
    decided = [c for c in verdicts if c.decided]
    right = np.mean([c.covers(truth) for c in decided]) if decided else np.nan
    print(f"{label}: crossover CI covers {covered:.3f}, band at the truth {band:.3f}, "
          f"decided {len(decided)}/{len(verdicts)} ({right:.3f} of them cover)")  # fmt: skip
    return covered, band, decided


@pytest.fixture(scope="module")
def measured_runs(crossing_runs):
    return [measure(req, CROSSING.deployment_id) for _, req in crossing_runs]


def test_crossover_interval_covers_the_truth(measured_runs):
    truth = CROSSING.exact_crossover()
    measured = measured_runs
    covered, band, decided = check_calibration(
        [m.crossover for m in measured], [m.curve for m in measured], truth, "pdbench"
    )
    assert covered >= COVERED
    assert NOMINAL[0] <= band <= NOMINAL[1]
    # not covered by being vague: a fair share is decided, and those are right
    assert len(decided) / RUNS >= DECIDED - tol(DECIDED, RUNS)
    assert np.mean([c.covers(truth) for c in decided]) >= LEVEL - tol(LEVEL, len(decided))
    assert all(c.shape is Shape.CROSSING for c in decided)


def iid_requests_curve(req):
    """A deliberately broken interval: every request its own cluster (no repetition level),
    as if the requests of a wave and of a Point were independent."""
    pairs = measure(req, CROSSING.deployment_id).pairs
    pairs = pairs.assign(request=np.arange(len(pairs)))
    cl, st = cluster_index(pairs, [*STRATUM, "request"], STRATUM)
    x, d = pairs["x"].to_numpy(float), pairs["d_ms"].to_numpy(float)
    return fit_curve(x, d, wave_weights(pairs), cl, st)


def test_an_interval_without_the_repetition_level_fails_the_calibration(crossing_runs):
    """The same checks on a broken interval fail: the test can tell."""
    truth = CROSSING.exact_crossover()
    curves = [iid_requests_curve(req) for _, req in crossing_runs]
    covered, band, _ = check_calibration(
        [crossover(c) for c in curves], curves, truth, "no repetition level"
    )
    assert covered < COVERED and band < NOMINAL[0]


def test_an_interval_too_wide_fails_the_calibration_too(measured_runs):
    """Bands twice as wide as measured cover too often and decide too rarely: the band's
    upper bound and the decided share can tell."""
    truth = CROSSING.exact_crossover()
    curves = [
        replace(c, low=c.fit - 2 * (c.fit - c.low), high=c.fit + 2 * (c.high - c.fit))
        for c in (m.curve for m in measured_runs)
    ]
    _, band, decided = check_calibration(
        [crossover(c) for c in curves], curves, truth, "twice as wide"
    )
    assert band > NOMINAL[1] and len(decided) / RUNS < DECIDED - tol(DECIDED, RUNS)


def test_equal_flows_are_called_inconclusive_at_the_nominal_rate():
    cells = control_sig = crossings = total_cells = 0
    for seed in range(RUNS):
        m = measure(run(EQUAL, seed), EQUAL.deployment_id)
        crossings += m.crossover.decided and m.crossover.shape is Shape.CROSSING
        total_cells += len(m.cells)
        cells += sum(not c.saving.decided for c in m.cells)
        control_sig += m.control.diff.decided
    equal_rate = cells / total_cells
    print(f"A/A: cells equal {equal_rate:.3f} ({total_cells} cells), decided crossings "
          f"{crossings / RUNS:.3f}, control significant {control_sig / RUNS:.3f}")  # fmt: skip
    # the cells of a run are not independent: the band counts runs (the docstring)
    assert NOMINAL[0] <= equal_rate <= NOMINAL[1]
    assert crossings / RUNS <= FALSE_ALARMS[1]
    # the A/A control itself: significant in about 5% of runs
    assert FALSE_ALARMS[0] <= control_sig / RUNS <= FALSE_ALARMS[1]
