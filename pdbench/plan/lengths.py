"""Token counts of a workload: fixed, or drawn around a mean from a seeded distribution; the
longest history that fits the model (``usable_history``), and the longest a run measures."""

from __future__ import annotations

import math
import random

from pdbench.config.schema import LengthDistribution, ModelConfig, RunConfig, WorkloadConfig

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


def history_cap(mean: int, median_ratio: float, cap: int) -> int:
    """The longest prefix ``draw_history`` returns."""
    if median_ratio >= 1 or mean <= 0:
        return mean
    return cap if cap > 0 else 3 * mean


def draw_history(rng: random.Random, mean: int, median_ratio: float, cap: int) -> int:
    """One conversation's prefix length: ``mean`` when ``median_ratio`` >= 1, else lognormal
    with that mean and median ``median_ratio`` x mean (mu = ln(median), sigma^2 =
    2 ln(mean / median): the parameters vLLM's benchmarks/multi_turn generator takes),
    clipped to [1, ``history_cap``]."""
    if median_ratio >= 1 or mean <= 0:
        return mean
    sigma = math.sqrt(2 * math.log(1 / median_ratio))
    value = rng.lognormvariate(math.log(median_ratio * mean), sigma)
    return min(max(1, round(value)), history_cap(mean, median_ratio, cap))


def longest_conversation(
    history: int, common: int, turns: int, user_max: int, output_max: int
) -> int:
    """Tokens of a conversation's last prompt and answer at the longest draws."""
    return common + history + turns * (user_max + output_max)


def usable_history(model: ModelConfig, workload: WorkloadConfig) -> int:
    """The longest history prefix whose conversation still fits the model's context: its
    turns at their longest draws, the common prefix and one 32-token block of margin."""
    user = max_length(
        workload.user_tokens, workload.user_tokens_jitter, workload.length_distribution
    )
    out = max_length(
        workload.output_tokens, workload.output_tokens_jitter, workload.length_distribution
    )
    turns = max(workload.turns, workload.turns_max)
    room = model.max_model_len - longest_conversation(
        0, workload.common_prefix_tokens, turns, user, out
    )
    return max(room - 32, 0)


def longest_history(cfg: RunConfig) -> int:
    """The longest history a run measures: its lengths', or its search's longest."""
    w = cfg.workload
    if w.history_tokens:
        return max(w.history_tokens)
    return cfg.search.max_history_tokens or usable_history(cfg.model, w)
