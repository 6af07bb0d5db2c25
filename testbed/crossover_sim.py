"""The crossover search run against a planted crossover: a synthetic deployment whose exact
crossover is known, measured with realistic noise and stalls (``measure``), searched to the
end (``search``), each round steered by the analysis's reading of the blocks so far
(``jobs.run.search_judge.reading_of_observations``). The unit tests and
``benchmarks/crossover_search.py`` share it."""

from __future__ import annotations

import random

from jobs.run.search_judge import estimates, reading_of_observations
from pdbench.config.schema import SearchConfig
from pdbench.plan import crossover_search as cs
from testbed.synthetic import SyntheticDeployment

USER = 32
MAX_TOKENS = 100_000  # a 128k-context model's usable history
REL_SD, STALL_SHARE, STALL_SDS = 0.08, 0.03, 3.0


def planted(crossover: float, c1_s: float = 2e-5) -> SyntheticDeployment:
    """A deployment whose exact crossover is ``crossover`` tokens: recompute at ``1 / c1_s``
    tokens/s (50k: an 8B model on a GPU; 3k: a 70B one, as in llm-d's load-aware example),
    pull 5x cheaper per token, attention's ``h^2`` included."""
    dep = SyntheticDeployment(c1_s=c1_s, c2_s=2e-11, model="llama3_8b")
    dep.beta_bytes_per_s = dep.transfer_kv_bytes_per_token / (dep.c1_s / 5)
    per = dep.c1_s / 5
    dep.alpha_s = (dep.c1_s - per) * crossover + dep.c2_s * crossover**2
    assert abs(dep.exact_crossover() - crossover) < 1e-6 * crossover
    return dep


def measure(dep: SyntheticDeployment, block: cs.Block, rng: random.Random) -> cs.Observation:
    rec = dep.recompute_s(block.history + USER) * 1e3
    pull = dep.pull_s(block.history, USER) * 1e3
    level = (rec + pull) / 2
    error = rng.gauss(0, REL_SD * level)
    if rng.random() < STALL_SHARE:
        error += rng.choice((-1, 1)) * STALL_SDS * REL_SD * level
    return cs.Observation(block.history, block.load, block.repetition, rec - pull + error, level)


def search(dep: SyntheticDeployment, seed: int, settings: SearchConfig | None = None):
    """Run the search to its end; (last round, Points measured)."""
    rng = random.Random(seed)
    plan = cs.search_plan(settings or SearchConfig(budget_min=60), MAX_TOKENS, [1], 2)
    blocks, seen, taken = plan.first_pass(), [], []
    for index in range(1, 1000):  # a round holds 2+ blocks: max_points ends it long before
        for block in blocks:
            seen.append(measure(dep, block, rng))
            taken.append(block)
        step = cs.next_round(plan, judged(plan, seen), taken, 0.0, index)
        if step.done:
            return step, 2 * len(taken)
        blocks = step.blocks
    raise AssertionError("the search never ended")


def judged(plan: cs.SearchPlan, seen: list[cs.Observation]) -> list[cs.LoadEstimate]:
    """Where each load stands by the analysis's reading of its blocks."""
    readings = {
        load: reading_of_observations([o for o in seen if o.load == load]) for load in plan.loads
    }
    return estimates(plan, readings, seen)
