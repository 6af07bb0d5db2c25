"""A Deployment's Points (pure): what each measures, its id, and the order they run in.

A Point is one measured workload on a Deployment: a flow, one history length, conversation
count and concurrency, and a repetition. Its id hashes its Deployment's id, its flow (with
the router knobs that flow uses) and its measured workload (``pdbench.results.identity``), so a
rerun finds what is done; the count of repetitions and the order seed say nothing about a
Point, so more repetitions later keep the ids of those measured.

Run order: randomized complete blocks. A block is one (workload Point, repetition) and holds
every flow once, in an order drawn at random; the blocks run in an order drawn at random
too. On a shared machine the speed drifts (other load, caches, thermals): measured flow
after flow, a drift would pass for a difference between flows. Shuffled this way, drift hits
every flow alike in expectation, and the flows of one block (the pairs a comparison uses)
run next to each other. The order depends only on the seed and the axes: a rerun runs the
same order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pdbench.config.schema import Flow, FlowConfig, WorkloadConfig
from pdbench.results.identity import flow_knobs, measured, stable_hash, with_retired
from pdbench.results.jsonable import to_jsonable

B = TypeVar("B")
F = TypeVar("F")

# Repetition r draws its conversations from seed + STRIDE * r: far apart, never equal for two
# repetitions of one seed (a prime, so nearby base seeds do not collide either).
REPETITION_SEED_STRIDE = 1_000_003

ORDER_DESIGN = "randomized complete blocks"  # what the dry run and the records call the order


@dataclass
class Point:
    """One measured workload on a Deployment: ``workload.history_tokens`` is
    ``[history_tokens]``, this Point's value of the sweep axis, and ``workload.seed`` its
    repetition's seed (``repetition_seed``)."""

    point_id: str
    deployment_id: str
    flow: Flow
    history_tokens: int
    workload: WorkloadConfig
    repetition: int = 0  # 0-based: independent Points of one (flow, history length)
    order_index: int = 0  # its place in its Deployment's run order (``randomized_blocks``)

    def workload_record(self) -> dict[str, Any]:
        """The workload as the id hashes it and records keep it: ``history_tokens`` a number,
        ``repetition`` this Point's."""
        return workload_record(self.workload, self.history_tokens, self.repetition)


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


def workload_record(
    workload: WorkloadConfig, history_tokens: int, repetition: int = 0
) -> dict[str, Any]:
    """One Point's workload: the sweep axes replaced by this Point's values (numbers:
    ``history_tokens``, ``conversations``, ``concurrency``, ``repetition``; the count of
    repetitions and the order seed say nothing about the Point, so more repetitions later
    keep the ids of those measured)."""
    record = to_jsonable(workload)
    record["history_tokens"] = history_tokens
    record["conversations"] = only(workload.conversations, "workload.conversations")
    record["concurrency"] = only(workload.concurrency, "workload.concurrency")
    record["repetition"] = repetition
    del record["repetitions"], record["order_seed"]
    return record


def only(values: list[int], key: str) -> int:
    """The one value of a Point's axis (a Point's workload holds one of each)."""
    if len(values) != 1:
        raise ValueError(f"{key}={values}: a Point measures one value of each axis")
    return values[0]


def shape_workload(workload: WorkloadConfig, history: int, conversations: int, concurrency: int):
    """A workload Point's workload: one history length, conversation count and concurrency."""
    return replace(
        workload,
        history_tokens=[history],
        conversations=[conversations],
        concurrency=[concurrency],
    )


def workload_points(workload: WorkloadConfig) -> list[tuple[int, WorkloadConfig]]:
    """(history length, the Point's workload) per workload Point: history lengths x
    conversation counts x concurrencies, each Point's workload holding its one value."""
    return [
        (history, shape_workload(workload, history, conversations, concurrency))
        for history in workload.history_tokens
        for conversations in workload.conversations
        for concurrency in workload.concurrency
    ]


def point_key(
    deployment_id: str,
    router: FlowConfig,
    flow: Flow,
    workload: WorkloadConfig,
    history: int,
    repetition: int,
) -> dict:
    """What a Point's id hashes: its Deployment, its flow (with the router knobs of its
    Deployment's ``router`` config that flow uses) and its measured workload
    (``pdbench.results.identity``)."""
    record = workload_record(workload, history, repetition)
    return {
        "deployment": deployment_id,
        "flow": flow.value,
        **flow_knobs(flow.value, to_jsonable(router)),
        "workload": with_retired("workload", measured("workload", record)),
    }


def make_point(
    deployment_id: str,
    router: FlowConfig,
    flow: Flow,
    shape: WorkloadConfig,
    history: int,
    repetition: int,
    order_index: int,
) -> Point:
    """One Point of the Deployment ``deployment_id`` (whose flow config is ``router``):
    ``shape`` (``shape_workload``) with its repetition's seed, its id hashed from what it
    measures."""
    point_workload = replace(shape, seed=repetition_seed(shape.seed, repetition))
    pid_key = point_key(deployment_id, router, flow, point_workload, history, repetition)
    return Point(
        point_id=f"{flow.value}-h{history}-r{repetition}-{stable_hash(pid_key, 10)}",
        deployment_id=deployment_id,
        flow=flow,
        history_tokens=history,
        workload=point_workload,
        repetition=repetition,
        order_index=order_index,
    )


def deployment_points(
    deployment_id: str, router: FlowConfig, flows: list[Flow], workload: WorkloadConfig
) -> list[Point]:
    """The Points of one Deployment in its run order (``randomized_blocks``: one block per
    (workload Point, repetition), every flow in each). A workload Point is a history length x
    conversation count x concurrency (``workload_points``)."""
    shapes = workload_points(workload)
    blocks = [(k, r) for k in range(len(shapes)) for r in range(workload.repetitions)]
    order = randomized_blocks(blocks, flows, workload.order_seed)
    return [
        make_point(deployment_id, router, flow, shapes[k][1], shapes[k][0], repetition, index)
        for index, ((k, repetition), flow) in enumerate(order)
    ]
