"""One task's run of a deployment job: its servers up, the rendezvous, then task 0 measures
(``jobs.run.loop``) while the others keep their servers up until it is done.

    preflight (every node)
    with this node's servers:
        rendezvous: every node's servers are up
        task 0: measure the Points; the others: wait for task 0
    (servers torn down)

Requeue: SLURM sends USR2 ``cluster.signal_delay_s`` before the time limit (or at a
preemption notice); submitit then pickles the job entry's ``checkpoint()`` answer (the job as
submitted: no live process), requeues the job and exits. A SIGTERM (``scontrol requeue``,
preemption, ``scancel``) tears down and exits without a result. Either way a Point cut short
has no record, and the requeued job (same job id, ``SLURM_RESTART_COUNT`` + 1) starts its
servers again and measures what is not recorded ``ok``: every Point once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from jobs.preflight.job import PreflightFailed, node_preflight, record_findings
from jobs.run.loop import measure_points
from jobs.run.next_points import NextPoints, PlannedPoints
from jobs.run.point import new_record
from jobs.run.rendezvous import NodeFailed, NodeRendezvous, gather_timeout_s
from jobs.run.serve import ServeUntilStopped
from jobs.run.servers import say, start_forker, start_servers
from jobs.run.state import TaskState
from jobs.serving.server import ServerStartError
from pdbench.config.schema import TrackingConfig
from pdbench.plan.crossover_search import SearchPlan
from pdbench.plan.deployments import Deployment
from pdbench.plan.points import Point
from pdbench.results.preflight import read_reports, reports_dir
from pdbench.results.store import RunStore, write_json_atomic
from pdbench.spec.launch import DeploymentSpec, forker_log, map_devices, resolve
from records.point import PointStatus

# How a search chooses its Points (``jobs.run.search_points.SearchPoints``), given by the job's
# entry: it reads records with the analysis (scipy, pandas: ~2 s of a task's start that a
# task without a search would pay for nothing).
SearchPointsOf = Callable[[Deployment, list[Point], list[str], SearchPlan, RunStore], NextPoints]


class DeploymentTask:
    """One task of the job for ``deployment``; ``task`` is what it holds while it runs."""

    def __init__(
        self,
        deployment: Deployment,
        points: list[Point],
        spec: DeploymentSpec,
        tracking: TrackingConfig,
        run_config: dict[str, Any],
        search: SearchPlan | None = None,
        search_points: SearchPointsOf | None = None,
    ):
        if search is not None and search_points is None:
            raise ValueError("a search needs its Points source (jobs.run.search_points)")
        self.deployment = deployment
        self.search = search
        self.search_points = search_points
        self.points = points
        self.spec = spec
        self.tracking = tracking
        self.run_config = run_config
        self.task = TaskState.of_environment(spec)

    def leave(self, why: str) -> None:
        """Stop at the next step (the checkpoint: the requeued job measures the rest)."""
        self.task.leave(why)

    def __call__(self) -> dict[str, Any]:
        task, spec = self.task, self.spec
        store = RunStore(spec.run_dir)
        if task.rank == 0 and task.attempt:
            say(
                f"job {task.job_id} restarted by SLURM (restart {task.attempt}): servers start "
                "again, Points recorded ok are skipped"
            )
        meeting = NodeRendezvous.of_attempt(
            spec.rendezvous_dir, task.job_id, task.attempt, spec.nodes, task.rank
        )
        if task.rank == 0:
            meeting.start_heartbeat()
        previous = signal.signal(signal.SIGTERM, task.on_sigterm)
        try:
            with ExitStack() as stack:
                try:
                    return self._run(stack, store, meeting)
                except PreflightFailed as exc:
                    # Nothing was started: every pending Point carries the one line.
                    meeting.publish_failure(str(exc))
                    if task.rank == 0:
                        self.fail_pending(store, str(exc))
                    say(str(exc))
                    raise
                except (ServerStartError, TimeoutError, NodeFailed) as exc:
                    # The deployment cannot run: every pending Point says why, in its record.
                    meeting.publish_failure(str(exc))
                    if task.rank == 0 and not task.leaving:
                        self.fail_pending(store, f"deployment did not start: {exc}")
                    raise
                finally:
                    if task.rank == 0:
                        meeting.done()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run(self, stack: ExitStack, store: RunStore, meeting: NodeRendezvous) -> dict[str, Any]:
        task, spec = self.task, self.spec
        mine = map_devices(resolve(spec, {task.rank: task.host}), task.rank, task.devices)
        server = self.deployment.server
        if spec.preflight:  # nothing is started before it passes
            self.preflight(store, meeting)
        forker = start_forker(stack, mine.on_node(task.rank), forker_log(mine, task.rank))
        urls = start_servers(stack, mine.on_node(task.rank), task, server.startup_timeout_s, forker)
        meeting.publish_node(task.host, urls, task.devices)
        if task.rank != 0:
            meeting.wait_for_rank0()
            return {"rank": task.rank, "host": task.host}
        nodes = meeting.gather_nodes(gather_timeout_s(server.startup_timeout_s))
        # Every node's address and devices are known now: the spec as it ran.
        ran = resolve(spec, nodes.addresses)
        for node, visible in nodes.devices.items():
            ran = map_devices(ran, node, visible)
        task.ran = ran
        write_json_atomic(store.launch_spec_path(ran.deployment_id), ran.to_dict())
        source: NextPoints = PlannedPoints(self.points, ran.run_order, store)
        if self.search is not None:  # the first pass, then rounds chosen as it goes
            source = self.search_points(
                self.deployment, self.points, ran.run_order, self.search, store
            )
        if ran.serve_flow:  # python -m pdbench serve: warm up, then serve until stopped
            source = ServeUntilStopped(self.deployment, self.points, ran, store, task)
        counts = measure_points(
            stack,
            self.deployment,
            ran,
            nodes.hosts,
            source,
            store,
            task,
            self.tracking,
            self.run_config,
        )
        return counts.to_dict()

    def preflight(self, store: RunStore, meeting: NodeRendezvous) -> None:
        """The job's first step on every node: check what the plan assumes before any
        server starts (``jobs.preflight.job``). Task 0 keeps every node's findings."""
        rank = self.task.rank
        try:
            reports = node_preflight(self.spec, rank, meeting.directory)
        except PreflightFailed as exc:
            if rank == 0:
                found = read_reports(reports_dir(meeting.directory), self.spec.nodes)
                record_findings(store, self.spec.deployment_id, found, str(exc))
            raise
        if rank == 0:
            record_findings(store, self.spec.deployment_id, reports, "")

    def fail_pending(self, store: RunStore, error: str) -> None:
        """Every Point not recorded ok gets a failed record saying ``error``."""
        for point in self.points:
            if store.point_status(point.point_id) is PointStatus.ok:
                continue
            now = time.time()
            record = new_record(self.deployment, point, self.task, started_at=now, finished_at=now)
            record.error = error
            store.write_point(record, [])
