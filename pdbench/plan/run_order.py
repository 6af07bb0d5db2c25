"""The order a Deployment measures its Points in, and the seeds of repetitions (pure).

Randomized complete blocks: a block is one (history length, repetition) and holds every flow
once, in an order drawn at random; the blocks run in an order drawn at random too. On a
shared machine the speed drifts (other load, caches, thermals): measured flow after flow, a
drift would pass for a difference between flows. Shuffled this way, drift hits every flow
alike in expectation, and the flows of one block (the pairs a comparison uses) run next to
each other. The order depends only on the seed and the axes: a rerun runs the same order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

B = TypeVar("B")
F = TypeVar("F")

# Repetition r draws its conversations from seed + STRIDE * r: far apart, never equal for two
# repetitions of one seed (a prime, so nearby base seeds do not collide either).
REPETITION_SEED_STRIDE = 1_000_003

DESIGN = "randomized complete blocks"  # what the dry run and the records call this order


def repetition_seed(seed: int, repetition: int) -> int:
    """The workload seed of repetition ``repetition`` (0 keeps ``seed``): every flow of one
    repetition uses it, so their conversations have the same token ids."""
    return seed + REPETITION_SEED_STRIDE * repetition


def randomized_blocks(blocks: Sequence[B], flows: Sequence[F], seed: int) -> list[tuple[B, F]]:
    """Every (block, flow) once: blocks in a seeded random order, flows shuffled within each."""
    rng = random.Random(seed)
    order = list(blocks)
    rng.shuffle(order)
    out: list[tuple[B, F]] = []
    for block in order:
        within = list(flows)
        rng.shuffle(within)
        out += [(block, flow) for flow in within]
    return out
