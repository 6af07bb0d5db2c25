"""Task 0's Points for a crossover search: the first pass as planned, then the rounds
``pdbench.plan.crossover_search`` chooses by the analysis's reading of the records so far
(``jobs.run.search_judge``).

Each round's blocks become ordinary Points (``make_point``: the same ids a grid would give),
in a seeded randomized-block order; a Point recorded ok (an earlier attempt) is not measured
again, and the observations come from every ok record of the Deployment, so a requeued job
continues the search where it was. Each round is logged in ``search/<deployment>.json``.
"""

from __future__ import annotations

import time
from collections import defaultdict

from jobs.run import search_judge
from jobs.run.next_points import PlannedPoints
from jobs.run.servers import say
from pdbench.plan.crossover_search import (
    Block,
    LoadEstimate,
    Observation,
    Round,
    SearchPlan,
    next_round,
)
from pdbench.plan.deployments import Deployment
from pdbench.plan.points import Point, make_point, randomized_blocks, shape_workload
from pdbench.results.store import RunStore, write_json_atomic
from records.point import PointResult, PointStatus, RequestRecord

ROUND_SEED_STRIDE = 7919  # round r's blocks are shuffled with order_seed + stride * r


def block_of(record: PointResult) -> Block:
    wl = record.workload_view
    return Block(wl.history_tokens, wl.concurrency or 1, record.repetition)


def differing_turns_ms(record: PointResult) -> float | None:
    """Mean TTFT of the turns where the flows differ (turn 2 on), weighted by requests."""
    rows = [r for r in record.by_turn if r.turn >= 2 and r.requests]
    total = sum(r.requests for r in rows)
    if not total:
        return None
    return sum(r.ttft_ms_mean * r.requests for r in rows) / total


def observations(records: list[PointResult], pull_flow: str) -> list[Observation]:
    """One paired saving per block with an ok record of recompute and of ``pull_flow``."""
    by_block: dict[Block, dict[str, float]] = defaultdict(dict)
    for record in records:
        if record.status != PointStatus.ok:
            continue
        ttft = differing_turns_ms(record)
        if ttft is not None:
            by_block[block_of(record)][record.flow] = ttft
    out = []
    for block, flows in sorted(by_block.items()):
        if "recompute" in flows and pull_flow in flows:
            rec, pull = flows["recompute"], flows[pull_flow]
            out.append(
                Observation(
                    block.history, block.load, block.repetition, rec - pull, (rec + pull) / 2
                )
            )
    return out


class SearchPoints:
    """A ``NextPoints``: the planned first pass, then the search's rounds until it is done."""

    def __init__(
        self,
        dep: Deployment,
        first_pass: list[Point],
        run_order_ids: list[str],
        plan: SearchPlan,
        store: RunStore,
    ):
        self.dep, self.plan, self.store = dep, plan, store
        self.first = PlannedPoints(first_pass, run_order_ids, store)
        self.recorded = self.first.recorded
        self.queue: list[Point] = []
        self.rounds: list[Round] = []
        flows = {f.value for f in plan.flows}
        self.pull_flow = "pull" if "pull" in flows else "decode_first"
        self._labels: dict[str, str] = {}
        self._read: dict[str, list[RequestRecord]] = {}  # ok Points' request records

    def warm_up_points(self) -> list[Point]:
        return self.first.warm_up_points()

    def label(self, point: Point) -> str:
        if point.point_id in self._labels:
            return self._labels[point.point_id]
        return "first pass " + self.first.label(point)

    def next_point(self, measured: list[PointResult]) -> Point | None:
        point = self.first.next_point(measured)
        if point is not None:
            return point
        while not self.queue:
            step = self._next_round()
            if step.done:
                return None
            self.queue = self._points(step)
        return self.queue.pop(0)

    def _records(self) -> list[PointResult]:
        mine = self.dep.deployment_id
        return [r for r in self.store.iter_points() if r.deployment_view.deployment_id == mine]

    def _requests(self, point_id: str) -> list[RequestRecord]:
        """A Point's request records, read once: an ok record is never rewritten, and each
        round reads every earlier one again."""
        if point_id not in self._read:
            self._read[point_id] = self.store.read_requests(point_id)
        return self._read[point_id]

    def standing(self, records: list[PointResult]) -> list[LoadEstimate]:
        """Where each load stands: the analysis's reading of these records (its request
        records read from the store), steered by (``jobs.run.search_judge``)."""
        with_requests = [
            (r, self._requests(r.point_id)) for r in records if r.status == PointStatus.ok
        ]
        try:
            readings = search_judge.readings_of_records(with_requests, self.dep.deployment_id)
        except Exception as exc:  # noqa: BLE001 - an analysis bug must not end the run
            say(f"search: the analysis could not read the records ({type(exc).__name__}: {exc})")
            readings = {}  # each load undetermined: its first lengths measured again
        return search_judge.estimates(self.plan, readings, observations(records, self.pull_flow))

    def _next_round(self) -> Round:
        records = self._records()
        spent = sum(max(r.finished_at - r.started_at, 0) for r in records)
        step = next_round(
            self.plan,
            self.standing(records),
            {block_of(r) for r in records},
            spent,
            len(self.rounds) + 1,
        )
        self.rounds.append(step)
        self._log(step)
        return step

    def _points(self, step: Round) -> list[Point]:
        wl = self.plan.workload
        order = randomized_blocks(
            step.blocks, list(self.plan.flows), wl.order_seed + ROUND_SEED_STRIDE * step.index
        )
        points = []
        for i, (block, flow) in enumerate(order):
            shape = shape_workload(wl, block.history, wl.conversations[0], block.load)
            # its place in the whole run order: after every Point of the earlier rounds
            index = step.points + i
            point = make_point(
                self.dep.deployment_id,
                self.dep.flow,
                flow,
                shape,
                block.history,
                block.repetition,
                index,
            )
            if self.store.point_status(point.point_id) is PointStatus.ok:
                continue
            self._labels[point.point_id] = (
                f"round {step.index} [{i + 1}/{len(order)}] {flow.value} h={block.history} "
                f"r={block.repetition} c={block.load}"
            )
            points.append(point)
        return points

    def _log(self, step: Round) -> None:
        lines = "; ".join(e.describe() for e in step.estimates)
        what = (
            f"done ({step.why})"
            if step.done
            else f"round {step.index}: {len(step.blocks)} blocks at "
            f"{sorted({b.history for b in step.blocks})}"
        )
        say(f"search after {step.points} Points, {step.spent_s / 60:.1f} min: {lines}; {what}")
        path = self.store.root / "search" / f"{self.dep.deployment_id}.json"
        write_json_atomic(
            path,
            {
                "deployment_id": self.dep.deployment_id,
                "plan": self.plan.describe(),
                "range": [self.plan.min_tokens, self.plan.max_tokens],
                "loads": list(self.plan.loads),
                "rounds": [r.to_dict() for r in self.rounds],
                "written_at": time.time(),
            },
        )
