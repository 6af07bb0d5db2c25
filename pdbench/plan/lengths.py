"""Token counts of a workload: fixed, or drawn around a mean from a seeded distribution."""

from __future__ import annotations

import math
import random

from pdbench.config.schema import LengthDistribution

LOGNORMAL_CAP = 3.0  # lognormal draws are clipped at mean * (1 + 3 * jitter)


def max_length(
    mean: int, jitter: float, distribution: LengthDistribution = LengthDistribution.uniform
) -> int:
    """The longest length ``draw_length`` returns (what context checks must allow)."""
    if jitter <= 0:
        return mean
    spread = LOGNORMAL_CAP * jitter if distribution == LengthDistribution.lognormal else jitter
    return max(1, round(mean * (1 + spread)))


def draw_length(
    rng: random.Random, mean: int, jitter: float, distribution: LengthDistribution
) -> int:
    """One token count around ``mean``: fixed (jitter 0), ``uniform`` in mean * (1 +- jitter),
    or ``lognormal`` with that mean and sigma = jitter (a long tail), clipped to
    [1, ``max_length``]."""
    if jitter <= 0:
        return mean
    if distribution == LengthDistribution.lognormal:
        value = rng.lognormvariate(math.log(mean) - jitter**2 / 2, jitter)
    else:
        value = rng.uniform(mean * (1 - jitter), mean * (1 + jitter))
    return min(max(1, round(value)), max_length(mean, jitter, distribution))
