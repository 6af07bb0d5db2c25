"""The crossover search's reading of its records: the analysis's own answer, per load.

A round of the search (``jobs.run.search_points``) asks where each load stands. The answer
is the one ``python -m analysis`` gives on the same records (``analysis.method.deployment``:
the saving curve fitted over every length, its interval by test inversion, the verdict),
read off as ``pdbench.plan.crossover_search.Reading`` for the pure planner to steer by.
So a search never says one crossover while the analysis of its run says another.

``reading_of_observations``: the same curve and verdict on one paired saving per block, for
the planted-crossover tests and benchmark (``testbed.crossover_sim``), which simulate
blocks, not requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from analysis.load.runs import typed_run_data
from analysis.method.deployment import Context
from analysis.method.saving_curve import Crossover, Shape, crossover, fit_curve
from analysis.method.stats import Status
from pdbench.plan.crossover_search import (
    LoadEstimate,
    Observation,
    Reading,
    SearchPlan,
    SearchShape,
    steer,
)
from records.point import PointResult, RequestRecord

SHAPES = {
    Shape.CROSSING: SearchShape.CROSSING,
    Shape.FALLING: SearchShape.FALLING,
    Shape.MIXED: SearchShape.MIXED,
    Shape.PULL_EVERYWHERE: SearchShape.PULL_EVERYWHERE,
    Shape.RECOMPUTE_EVERYWHERE: SearchShape.RECOMPUTE_EVERYWHERE,
    Shape.NO_DATA: SearchShape.UNDETERMINED,
}


def reading(c: Crossover) -> Reading:
    """The analysis's verdict as the planner steers by it."""
    undetermined = c.status is Status.UNDETERMINED or c.shape is Shape.NO_DATA
    return Reading(
        shape=SearchShape.UNDETERMINED if undetermined else SHAPES[c.shape],
        decided=c.decided,
        estimate=c.estimate,
        low=c.low,
        high=c.high,
        lo=c.lo or 0.0,
        hi=c.hi or 0.0,
        reason=c.reason,
        text=c.describe(),
    )


def readings_of_records(
    records: list[tuple[PointResult, list[RequestRecord]]], deployment_id: str
) -> dict[int | None, Reading]:
    """Per load (concurrency; None where the Points name none) of ``deployment_id``, the
    analysis's crossover on these records."""
    analysed = Context.of(typed_run_data(records)).deployment(deployment_id)
    return {load.concurrency: reading(load.measured.crossover) for load in analysed.loads}


def reading_of_observations(observations: Sequence[Observation]) -> Reading:
    """The analysis's curve and verdict on block savings: each block a cluster, each length a
    stratum, weights ``1 / level^2`` with the length's mean level (as the analysis weighs
    its waves)."""
    if not observations:
        return reading(crossover(None, "no pairs"))
    # in one order whatever order they came in: the same blocks, the same reading
    observations = sorted(observations, key=lambda o: (o.history, o.repetition, o.saving_ms))
    lengths = sorted({o.history for o in observations})
    level = {
        h: float(np.mean([o.level_ms for o in observations if o.history == h])) for h in lengths
    }
    blocks = sorted({(o.history, o.repetition) for o in observations})
    cluster_of = {b: i for i, b in enumerate(blocks)}
    stratum_of = {h: i for i, h in enumerate(lengths)}
    curve = fit_curve(
        np.array([o.history for o in observations], float),
        np.array([o.saving_ms for o in observations], float),
        np.array([1.0 / max(level[o.history], 1e-9) ** 2 for o in observations]),
        np.array([cluster_of[(o.history, o.repetition)] for o in observations]),
        np.array([stratum_of[h] for h, _ in blocks]),
    )
    return reading(crossover(curve, "" if curve else "fewer than two history lengths"))


def estimates(
    plan: SearchPlan,
    readings: dict[int | None, Reading],
    observations: Sequence[Observation],
) -> list[LoadEstimate]:
    """Where each of the plan's loads stands (``steer``): its reading, and the repetitions
    measured per length at that load (``observations``)."""
    out = []
    for load in plan.loads:
        counts = Counter(o.history for o in observations if o.load == load)
        found = readings.get(load) or (readings.get(None) if len(plan.loads) == 1 else None)
        if found is None:
            found = reading(crossover(None, "no paired requests at this load yet"))
        out.append(steer(load, found, dict(counts), plan))
    return out
