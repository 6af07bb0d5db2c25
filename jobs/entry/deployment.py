"""The deployment job's entry: what the driver submits for one Deployment, all it pickles.

``DeploymentJob`` holds the Deployment, its Points, its launch spec, the tracking config and
the composed config, nothing else: submitit pickles it to every task, and again at
``checkpoint()`` for a requeue. Calling it runs ``jobs.run.task`` on the task; that import
happens there, never in the driver, and ``jobs.run.search_points`` (the analysis, scipy,
pandas) only for a job that runs the crossover search.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import submitit

from pdbench.config.schema import TrackingConfig
from pdbench.plan.crossover_search import SearchPlan
from pdbench.plan.deployments import Deployment
from pdbench.plan.points import Point
from pdbench.results.disk import RunFailure, write_problem
from pdbench.spec.launch import DeploymentSpec


@dataclass
class DeploymentJob:
    """A picklable submitit callable for one Deployment: runs its launch spec."""

    deployment: Deployment
    points: list[Point]
    spec: DeploymentSpec
    tracking: TrackingConfig
    run_config: dict[str, Any]  # the composed config as JSON, for the tracker
    # The crossover search (no history lengths given): ``points`` is its first pass
    search: SearchPlan | None = None
    # The task's run while ``__call__`` runs (its live servers): not part of what was
    # submitted, never pickled (``checkpoint`` pickles ``restart()``).
    running: Any = field(default=None, init=False, repr=False, compare=False)
    # This attempt's start and the Point records the run dir held then (``checkpoint``:
    # an attempt cut by its time limit that wrote none is not requeued).
    started: tuple[float, dict[str, float]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __call__(self) -> dict[str, Any]:
        from jobs.run import task  # lazy: node runtime, loaded on the allocation only

        searching = None
        if self.search is not None:  # its Points chosen by the analysis (scipy, pandas)
            from jobs.run import search_points  # lazy: node runtime, loaded on the allocation only

            searching = search_points.SearchPoints
        self.started = (time.time(), point_records(self.spec.run_dir))

        self.running = task.DeploymentTask(
            self.deployment,
            self.points,
            self.spec,
            self.tracking,
            self.run_config,
            self.search,
            searching,
        )
        try:
            return self.running()
        except OSError as err:  # a write the disk refused: one line for the driver
            line = write_problem(err, self.spec.run_dir)
            if line is None:
                raise
            traceback.print_exc()  # the whole of it stays in this job's log
            raise RunFailure(line) from None

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission | None:
        """What submitit pickles at USR2 (time limit near, or a preemption notice) before it
        requeues the job and exits: this job as submitted (``restart``), never the live
        servers (a lock in each ``Popen``: cannot be pickled). The requeue then SIGTERMs the
        job: from here that must not cut the teardown short. A serve job is not requeued
        (None): it served until its time limit."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.spec.serve_flow:  # a serve job ends at its time limit: nothing to resume
            os.write(1, b"[pdbench] time limit near: serving ends, the servers stop\n")
            if self.running is not None:
                self.running.leave("time limit near (USR2)")
            return None
        if self.running is not None:
            self.running.leave("time limit near or preemption notice (USR2)")
        if self.recorded_nothing_by_its_time_limit():
            os.write(
                1,
                b"[pdbench] time limit near and this attempt recorded no Point: the job is not "
                b"requeued (every attempt would end the same way). Fix: a longer "
                b"cluster.time_limit_min (the servers' start and one Point must fit), then "
                b"rerun the same command: Points recorded ok are skipped\n",
            )
            return None
        # os.write, not print: a signal handler may interrupt a print (reentrant call).
        os.write(
            1,  # stdout: the job's log
            b"[pdbench] time limit near or preemption notice: checkpointed; the requeued job "
            b"starts the servers again and measures the Points not recorded ok\n",
        )
        return submitit.helpers.DelayedSubmission(self.restart())

    def recorded_nothing_by_its_time_limit(self) -> bool:
        """Whether this attempt ran into its time limit (submitit's rule: 80% of the limit,
        at most 10 min before it; a preemption comes earlier) without writing any Point
        record: requeueing it would only repeat that."""
        if self.started is None:
            return False
        since, records = self.started
        limit_s = 60.0 * float(self.run_config.get("cluster", {}).get("time_limit_min", 0) or 0)
        timed_out = limit_s > 0 and time.time() - since >= min(0.8 * limit_s, limit_s - 600)
        return timed_out and point_records(self.spec.run_dir) == records

    def restart(self) -> DeploymentJob:
        """This job as submitted: the Deployment, its Points, the launch spec, no state."""
        return replace(self)


def point_records(run_dir: str | Path) -> dict[str, float]:
    """The run dir's Point records and when each was last written."""
    try:
        return {p.name: p.stat().st_mtime for p in (Path(run_dir) / "points").glob("*.json")}
    except OSError:
        return {}
