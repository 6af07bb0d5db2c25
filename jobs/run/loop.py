"""Task 0's run loop: with the servers up, start the router, warm up, then measure what
``NextPoints`` hands out, one Point at a time, each record written as soon as it is measured.

    with router:
        warm up
        for point in next points:
            measure, write the record, report it

A signal or the checkpoint (``TaskState.leave``) stops it between steps: the Point in
progress is not recorded. A Point during which a server died ends the Deployment's run.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from jobs.run.next_points import NextPoints
from jobs.run.point import Serving, measure_point
from jobs.run.servers import say, start_router
from jobs.run.state import TaskState
from jobs.run.warm_up import warm_up
from jobs.tracking import make_tracker
from pdbench.config.schema import TrackingConfig
from pdbench.plan.deployments import Deployment
from pdbench.results.store import RunStore
from pdbench.spec.launch import DeploymentSpec
from records.point import PointResult, PointStatus


@dataclass
class Counts:
    """What a run of the loop did, task 0's result."""

    deployment: str
    ok: int = 0
    failed: int = 0
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "ok": self.ok,
            "failed": self.failed,
            "skipped": self.skipped,
        }


def measure_points(
    stack: ExitStack,
    dep: Deployment,
    ran: DeploymentSpec,
    hosts: dict[str, str],
    source: NextPoints,
    store: RunStore,
    task: TaskState,
    tracking: TrackingConfig,
    run_config: dict[str, Any],
) -> Counts:
    """Start the router (owned by ``stack``), then measure every Point ``source`` gives."""
    urls = {inst.name: inst.url for inst in ran.instances}
    router_url = start_router(stack, ran.router, task)
    serving = Serving(dep, ran, urls, router_url, hosts)
    tracker = make_tracker(tracking, store.root, store.root.name)
    warm = source.warm_up_points()
    if warm:
        warm_up(dep, warm, router_url, store)
        task.check_leaving()
    warmed = {(p.flow, p.history_tokens) for p in warm}
    counts = Counts(ran.deployment_id, skipped=len(source.recorded))
    if source.recorded:
        say(f"skipping {len(source.recorded)} Point(s) recorded ok: {', '.join(source.recorded)}")
    measured: list[PointResult] = []
    while (point := source.next_point(measured)) is not None:
        task.check_leaving()
        if (point.flow, point.history_tokens) not in warmed:  # a length the search chose
            warm_up(dep, [point], router_url, store)
            warmed.add((point.flow, point.history_tokens))
        label = source.label(point)
        say(f"point {label} ({point.point_id})")
        result, records = measure_point(serving, point, store, task, label)
        task.check_leaving()  # cut short: no record, the requeued job measures it
        store.write_point(result, records)
        tracker.log_point(result, run_config)
        measured.append(result)
        if result.status is PointStatus.ok:
            counts.ok += 1
            continue
        counts.failed += 1
        dead = [p.name for p in task.dead()]
        if dead:
            say(f"servers died: {dead}; stopping this deployment")
            break
    tracker.close()
    return counts
