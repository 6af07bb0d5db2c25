"""One executor face over submitit's backends: ``cluster.executor`` picks local, slurm or debug.

A job of N plan nodes runs as N submitit tasks: on SLURM one task per node (``nodes=N``,
``tasks_per_node=1``); locally, N tasks on this machine (``tasks_per_node=N``), each acting
as one plan node. Task rank == plan node index either way.

SLURM goes through ``SlurmExecutor``, submitit's own with one change: job state comes from
``sacct`` when the cluster keeps accounting and from ``squeue`` when it does not (the local
test cluster, small clusters without slurmdbd), so a cancelled or failed job is seen as
finished instead of waiting forever in state UNKNOWN.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm import slurm as submitit_slurm

from pdbench.config.schema import ClusterConfig, ExecutorKind
from pdbench.spec.sbatch import executor_parameters

log = logging.getLogger(__name__)

# State of a job SLURM no longer lists (it ended more than MinJobAge ago) and no accounting
# can tell how: finished, outcome unknown. Not a SLURM state name.
PURGED = "PURGED"

STATE_SOURCE_ENV = "PDBENCH_SLURM_STATE_SOURCE"  # "sacct" | "squeue"; unset: probe sacct


class SlurmStateWatcher(submitit_slurm.SlurmInfoWatcher):
    """submitit's job-state poller, falling back from ``sacct`` to ``squeue``.

    The first poll runs submitit's ``sacct`` query; if that fails (no accounting storage),
    this and later polls read ``squeue --me --states=all`` instead. ``squeue`` lists jobs
    for MinJobAge after they end; a watched job missing from it is reported as ``PURGED``.
    """

    _SQUEUE = ["squeue", "--me", "--states=all", "--noheader", "--format=%i|%T|%N"]

    def __init__(self, delay_s: int = 60) -> None:
        super().__init__(delay_s=delay_s)
        self.source = os.environ.get(STATE_SOURCE_ENV, "") or None

    def _make_command(self) -> list[str] | None:
        command = super()._make_command()
        if command is None:
            return None
        if self.source is None:
            self.source = "sacct" if _succeeds(command) else "squeue"
            if self.source == "squeue":
                log.info("sacct is unavailable here: reading SLURM job states from squeue")
        return list(self._SQUEUE) if self.source == "squeue" else command

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        if self.source != "squeue":
            return super().read_info(string)
        if not isinstance(string, str):
            string = string.decode()
        info = super().read_info("JobID|State|NodeList\n" + string)
        watched = self._registered - self._finished
        for job_id in watched - set(info):
            info[job_id] = {"JobID": job_id, "State": PURGED, "NodeList": ""}
        return info


def _succeeds(command: list[str]) -> bool:
    try:
        subprocess.run(command, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


class SlurmJob(submitit_slurm.SlurmJob):
    """A submitit SLURM job whose state queries work without accounting."""

    # One watcher for every job: a poll asks SLURM about all of them at once. submitit's
    # default minute, not ten: a job that died without a result is seen within a minute.
    watcher = SlurmStateWatcher(delay_s=60)

    def done(self, force_check: bool = False) -> bool:
        """submitit's, with ``force_check`` forcing a job of several tasks too: submitit
        asks each task without it, from the watcher's cache, so a 2-node job scancel'led
        was seen ended ~55 s late (the e2e SLURM chain)."""
        if force_check and self.num_tasks > 1:
            self.watcher.update_if_long_enough(mode="force")
        return super().done(force_check=force_check)


class SlurmExecutor(submitit_slurm.SlurmExecutor):
    """submitit's ``SlurmExecutor`` handing out ``SlurmJob`` (arrays included)."""

    job_class = SlurmJob

    def _internal_process_submissions(self, delayed_submissions):  # type: ignore[override]
        jobs = super()._internal_process_submissions(delayed_submissions)
        # submitit builds array elements as its own SlurmJob; rewrap them as ours.
        return [
            job
            if isinstance(job, SlurmJob)
            else SlurmJob(folder=self.folder, job_id=job.job_id, tasks=list(range(job.num_tasks)))
            for job in jobs
        ]


SUBMITIT_MAX_REQUEUES = 3  # submitit's max_num_timeout: a job with no Points of its own


def max_requeues(cluster: ClusterConfig, points: int) -> int:
    """Requeues a job of ``points`` Points may take after time limits: ``cluster.max_requeues``
    when set, else one per Point (each attempt records one at least, or ends the chain)."""
    return cluster.max_requeues or points or SUBMITIT_MAX_REQUEUES


def visible_gpus(environ: Mapping[str, str] | None = None) -> tuple[int, ...]:
    """The GPU indices the driver's ``CUDA_VISIBLE_DEVICES`` names, () when unset, empty or
    not a list of indices (UUIDs: submitit's local executor takes indices only)."""
    value = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES", "")
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        return ()
    return tuple(int(p) for p in parts)


def make_executor(
    cluster: ClusterConfig,
    folder: Path,
    nodes: int,
    job_name: str,
    points: int = 0,
    tasks_per_node: int = 1,
):
    """A submitit executor for ``cluster`` whose jobs span ``nodes`` plan nodes of
    ``tasks_per_node`` tasks and measure at most ``points`` Points each (0: not Points, e.g.
    the transfer bench)."""

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = executor_parameters(cluster, nodes, job_name, visible_gpus(), tasks_per_node)
    executor: Any
    if cluster.executor is ExecutorKind.slurm:
        executor = SlurmExecutor(folder=folder, python=cluster.python or None)
    elif cluster.executor is ExecutorKind.debug:
        executor = submitit.DebugExecutor(folder=folder)
    else:
        executor = submitit.LocalExecutor(folder=folder, python=cluster.python or None)
    executor.update_parameters(**params)
    executor.max_num_timeout = max_requeues(cluster, points)  # read at each submit
    return executor
