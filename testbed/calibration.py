"""Is an interval method calibrated? Its coverage of a known truth, checked at every length.

A method is run on seeded synthetic runs whose truth is known (``testbed.synthetic``); for
each run it reports, per history length, a cell (the mean paired saving, ``estimate``,
``se``, ``df``), the fitted curve's band at both ends of the measured range and at the true
crossover (where the true saving is 0 whatever the noise), and the crossover's interval.
``calibration`` compares those with the truth:

- coverage at 50% and at 95% of the cells and of the band's three points, each within
  ``stats.rate_tolerance`` (3 binomial sigmas, the sigma counting every checked interval)
  of the nominal rate. Two levels, because an interval whose scale is off by 20% moves the
  50% coverage by ~10 points but the 95% one by ~3: a check at 95% alone passes it. The
  intervals at 50% come from each one's own ``se`` and ``df`` through ``stats.t_crits``,
  the method's quantiles;
- the spread: the errors' mean square over the standard errors' mean square, each
  interval scaled by its length's (or band point's) mean squared standard error so that no
  length dominates, must hold 1 within 3 of its own standard errors (delta method over the
  runs, which are independent). An unbiased variance gives 1 whatever the noise's shape,
  where the coverage at a level depends on the shape too: a plain bootstrap's variance,
  ``(R - 1) / R`` of the unbiased one, gives 1.5 at three repetitions;
- the crossover's interval covers the truth in at least 95% less the tolerance of the runs
  (it is conservative by construction: no upper bound);
- power: the share of cells decided and of runs whose crossover is decided must reach the
  floors given (measured on the method itself, less the tolerance): an interval that is
  valid but wider than it needs be (pairing the wrong repetitions) fails there.

A check passes when its rate lies in its band; ``calibration`` returns every check, and a
method is calibrated when all pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analysis.method import stats
from analysis.method.saving_curve import Crossover, SavingCurve

LEVELS = (0.5, 0.95)


@dataclass(frozen=True)
class Interval:
    """One interval of the method: its estimate, standard error and df, and the truth."""

    estimate: float
    se: float
    df: float
    truth: float
    decided: bool = False

    def covers(self, level: float) -> bool:
        half = float(stats.t_crits(np.array([self.df]), level)[0]) * self.se
        return bool(abs(self.estimate - self.truth) <= half)


@dataclass(frozen=True)
class RunEstimates:
    """What the method said on one run."""

    cells: tuple[Interval, ...]
    band: tuple[Interval, ...]  # at the shortest, the longest length and the true crossover
    crossover_covers: bool
    crossover_decided: bool


def run_estimates(
    curve: SavingCurve, cells: list[tuple[float, float, float, float, bool]], cross: Crossover,
    saving_ms, root: float,
) -> RunEstimates:  # fmt: skip
    """``cells``: (x, estimate, se, df, decided) per length; ``saving_ms(x)``: the truth."""

    def at(h: float, truth: float) -> Interval:
        i = min(int(np.searchsorted(curve.grid, h)), len(curve.grid) - 1)
        return Interval(float(curve.fit[i]), float(curve.se[i]), float(curve.df[i]), truth)

    ends = [at(x, saving_ms(x)) for x in (curve.x_min, curve.x_max)]
    band = (*ends, at(root, 0.0)) if curve.x_min <= root <= curve.x_max else tuple(ends)
    return RunEstimates(
        tuple(Interval(e, s, d, saving_ms(x), dec) for x, e, s, d, dec in cells),
        band,
        cross.covers(root),
        cross.decided,
    )


@dataclass(frozen=True)
class Check:
    name: str
    rate: float
    low: float
    high: float
    n: int

    @property
    def passed(self) -> bool:
        return bool(self.low <= self.rate <= self.high)

    def line(self) -> str:
        mark = "ok  " if self.passed else "FAIL"
        return (
            f"{mark} {self.name}: {self.rate:.3f} in [{self.low:.3f}, {self.high:.3f}] (n={self.n})"
        )


def _two_sided(name: str, hits: list[bool], nominal: float) -> Check:
    tol = stats.rate_tolerance(nominal, len(hits))
    return Check(name, float(np.mean(hits)), nominal - tol, nominal + tol, len(hits))


def _floor(name: str, hits: list[bool], floor: float) -> Check:
    tol = stats.rate_tolerance(min(max(floor, 0.01), 0.99), len(hits))
    return Check(name, float(np.mean(hits)), floor - tol, 1.0, len(hits))


def _spread(name: str, runs: list[tuple[Interval, ...]]) -> Check:
    """Mean squared error over mean squared se (module docstring), with a 3-sigma band."""
    k = min(len(r) for r in runs)
    err = np.array([[(i.estimate - i.truth) ** 2 for i in r[:k]] for r in runs])
    se2 = np.array([[i.se**2 for i in r[:k]] for r in runs])
    ok = np.isfinite(err).all(axis=1) & np.isfinite(se2).all(axis=1)
    err, se2 = err[ok], se2[ok]
    scale = se2.mean(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    a, b = (err / scale).sum(axis=1), (se2 / scale).sum(axis=1)
    ratio = a.sum() / b.sum()
    sigma = np.std(a - ratio * b, ddof=1) / b.mean() / np.sqrt(len(a))
    tol = stats.CALIBRATION_SIGMAS * sigma
    return Check(name, float(ratio), 1.0 - tol, 1.0 + tol, len(a))


def calibration(
    runs: list[RunEstimates], cells_decided: float = 0.0, crossovers_decided: float = 0.0
) -> list[Check]:
    """Every check above (``cells_decided``/``crossovers_decided``: the power floors)."""
    cells = [c for r in runs for c in r.cells]
    band = [b for r in runs for b in r.band]
    out = []
    for level in LEVELS:
        out.append(
            _two_sided(f"cells cover at {level:.0%}", [c.covers(level) for c in cells], level)
        )
        out.append(
            _two_sided(f"band covers at {level:.0%}", [b.covers(level) for b in band], level)
        )
    out.append(_spread("cells: errors' mean square / se's", [r.cells for r in runs]))
    out.append(_spread("band: errors' mean square / se's", [r.band for r in runs]))
    crossing = [r.crossover_covers for r in runs]
    low = stats.LEVEL - stats.rate_tolerance(stats.LEVEL, len(runs))
    out.append(Check("crossover interval covers", float(np.mean(crossing)), low, 1.0, len(runs)))
    out.append(_floor("cells decided", [c.decided for c in cells], cells_decided))
    decided = [r.crossover_decided for r in runs]
    out.append(_floor("crossovers decided", decided, crossovers_decided))
    return out


def failed(checks: list[Check]) -> list[str]:
    return [c.line() for c in checks if not c.passed]
