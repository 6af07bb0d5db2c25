"""A crossover search that can find no crossover is refused before anything starts (pure).

With ``workload.history_tokens: []`` the run searches (``pdbench.plan.crossover_search``):
its first pass is ``search.first_pass_lengths`` log-spaced lengths in
``[search.min_history_tokens, the longest history the model's context leaves]``, each
``workload.repetitions`` times, at every load and flow. A range of one length has no
crossover in it; a first pass above ``search.max_points`` ends the search before its first
round.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import Command, RunConfig, WorkloadKind
from pdbench.plan.attempt import first_pass
from pdbench.plan.crossover_search import LOG_FLOOR, SearchPlan, search_plan
from pdbench.plan.lengths import usable_history


def check_search(cfg: RunConfig) -> list[ConfigProblem]:
    """The search's range holds more than one length and its first pass fits its cap."""
    w, s = cfg.workload, cfg.search
    if cfg.command is not Command.run or w.history_tokens or w.kind is WorkloadKind.trace:
        return []
    usable = usable_history(cfg.model, w)
    high = min(s.max_history_tokens or usable, usable)
    out = Problems()
    if s.min_history_tokens >= high:
        out.add(
            "search.min_history_tokens",
            s.min_history_tokens,
            f"is at or above the longest history the search measures ({high:,} tokens: "
            f"{'search.max_history_tokens' if s.max_history_tokens else 'what the context leaves'}"
            "): the first pass is one length, and one length holds no crossover",
            f"search.min_history_tokens below {high:,} (0: from no history)",
        )
        return out
    flows = list(dict.fromkeys(cfg.flow.flows))
    plan = search_plan(s, usable, w.concurrency, len(flows), w, flows)
    first = len(plan.first_lengths) * w.repetitions * len(w.concurrency) * len(flows)
    out.extend(first_pass_over_budget(cfg, plan, usable))
    if first > s.max_points:
        out.add(
            "search.max_points",
            s.max_points,
            f"is below the first pass alone: {len(plan.first_lengths)} lengths x "
            f"{w.repetitions} repetitions x {len(w.concurrency)} load(s) x {len(flows)} flows = "
            f"{first:,} Points per Deployment, so the search would end before its first round",
            f"search.max_points={first * 2} or more, or fewer search.first_pass_lengths, "
            "repetitions or loads",
        )
    return out


def first_pass_over_budget(cfg: RunConfig, plan: SearchPlan, usable: int) -> list[ConfigProblem]:
    """The first pass's estimated time (``pdbench.plan.attempt.first_pass``; GPU clusters with
    ``cluster.gpu_tflops``) against ``search.budget_min``, which is looked at only after the
    first pass: a first pass over it measures long contexts for nothing the budget allowed."""
    s = cfg.search
    est = first_pass(cfg, plan)
    if est.seconds is None or est.seconds <= 60 * s.budget_min:
        return []
    fitting = longest_fitting(cfg, usable)
    shorter = (
        f", or search.max_history_tokens={fitting} (its first pass fits {s.budget_min:g} min)"
        if fitting
        else ""
    )
    return [
        ConfigProblem(
            "search.budget_min",
            s.budget_min,
            f"is below the first pass alone: {est.points} Points up to {est.longest:,} tokens "
            f"take about {est.seconds / 60:,.0f} min by the rough estimate (P's prefill at "
            "cluster.gpu_tflops' assumed MFU), and the budget is looked at only after them",
            f"search.budget_min={math.ceil(est.seconds / 60) * 2} (the first pass and as much "
            f"again for its rounds){shorter}",
        )
    ]


def longest_fitting(cfg: RunConfig, usable: int) -> int:
    """The longest ``search.max_history_tokens`` (a nice length) whose first pass fits the
    budget, 0 when none does."""
    s, w = cfg.search, cfg.workload
    flows = list(dict.fromkeys(cfg.flow.flows))
    best, low, high = 0, max(s.min_history_tokens + 1, LOG_FLOOR * 4), usable
    while low <= high:  # the first pass's time grows with its longest length
        mid = (low + high) // 2
        trial = replace(s, max_history_tokens=mid)
        plan = search_plan(trial, usable, w.concurrency, len(flows), w, flows)
        seconds = first_pass(cfg, plan).seconds
        if seconds is not None and seconds <= 60 * s.budget_min:
            best, low = mid, mid + 1
        else:
            high = mid - 1
    if best < 100:
        return best
    step = 10 ** (int(math.log10(best)) - 1)  # two significant digits, rounded down
    return best // step * step
