"""A crossover search that can find no crossover is refused before anything starts (pure).

With ``workload.history_tokens: []`` the run searches (``pdbench.plan.crossover_search``):
its first pass is ``search.first_pass_lengths`` log-spaced lengths in
``[search.min_history_tokens, the longest history the model's context leaves]``, each
``workload.repetitions`` times, at every load and flow. A range of one length has no
crossover in it; a first pass above ``search.max_points`` ends the search before its first
round.
"""

from __future__ import annotations

from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import Command, RunConfig, WorkloadKind
from pdbench.plan.crossover_search import search_plan
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
