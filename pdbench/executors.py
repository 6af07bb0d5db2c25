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
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from submitit.slurm import slurm as submitit_slurm

from pdbench.config import ClusterConfig, ExecutorKind

log = logging.getLogger(__name__)

# SLURM sends submitit's USR2 this long before the time limit (sbatch --signal=USR2@N): the
# job checkpoints and requeues itself, and its servers get time to shut down cleanly.
SIGNAL_DELAY_S = 120

# State of a job SLURM no longer lists (it ended more than MinJobAge ago) and no accounting
# can tell how: finished, outcome unknown. Not a SLURM state name.
PURGED = "PURGED"

STATE_SOURCE_ENV = "PDBENCH_SLURM_STATE_SOURCE"  # "sacct" | "squeue"; unset: probe sacct

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def signal_delay_s(time_limit_min: int) -> int:
    """Seconds before the time limit that USR2 comes: SIGNAL_DELAY_S, at most half the limit.

    A delay longer than the limit would signal (and requeue) the job as soon as it starts.
    """
    return max(1, min(SIGNAL_DELAY_S, time_limit_min * 60 // 2))


def env_exports(env: dict[str, str]) -> list[str]:
    """Shell lines exporting ``env`` (values quoted), in the mapping's order."""
    lines = []
    for key, value in env.items():
        if not _ENV_NAME.match(str(key)):
            raise ValueError(f"cluster.env: {key!r} is not a valid environment variable name")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    return lines


def slurm_parameters(cluster: ClusterConfig, nodes: int, job_name: str) -> dict[str, Any]:
    """``submitit.SlurmExecutor.update_parameters`` keywords (its native, sbatch-like names)."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": cluster.time_limit_min,
        "nodes": nodes,
        "ntasks_per_node": 1,
        "signal_delay_s": signal_delay_s(cluster.time_limit_min),
        "array_parallelism": cluster.array_parallelism,
    }
    if cluster.gpus_per_node:
        params["gpus_per_node"] = cluster.gpus_per_node
    cpus = cluster.cpus_per_task or cluster.cpus_per_node
    if cpus:
        params["cpus_per_task"] = cpus
        # srun 22.05-23.02 ignores the batch script's --cpus-per-task: repeat it for the step.
        params["srun_args"] = [f"--cpus-per-task={cpus}"]
    if cluster.mem_gb:
        params["mem"] = f"{cluster.mem_gb}GB"
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(cluster, key)
        if value:
            params[key] = value
    if cluster.exclusive:
        params["exclusive"] = True
    if cluster.additional_parameters:
        params["additional_parameters"] = dict(cluster.additional_parameters)
    setup = list(cluster.setup) + env_exports(dict(cluster.env))
    if setup:
        params["setup"] = setup
    return params


def local_parameters(cluster: ClusterConfig, nodes: int, job_name: str) -> dict[str, Any]:
    """``submitit.LocalExecutor.update_parameters`` keywords: N tasks on this machine."""
    params: dict[str, Any] = {
        "name": job_name,
        "timeout_min": cluster.time_limit_min,
        "tasks_per_node": nodes,
        "signal_delay_s": signal_delay_s(cluster.time_limit_min),
    }
    setup = list(cluster.setup) + env_exports(dict(cluster.env))
    if setup:
        params["setup"] = setup
    return params


def executor_parameters(cluster: ClusterConfig, nodes: int, job_name: str) -> dict[str, Any]:
    """The ``update_parameters`` keywords of ``make_executor``'s executor for ``nodes`` nodes."""
    if nodes < 1:
        raise ValueError(f"a job needs at least one node, got nodes={nodes}")
    if cluster.executor is ExecutorKind.slurm:
        return slurm_parameters(cluster, nodes, job_name)
    if cluster.executor is ExecutorKind.debug:
        return {"name": job_name, "timeout_min": cluster.time_limit_min}
    return local_parameters(cluster, nodes, job_name)


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

    watcher = SlurmStateWatcher(delay_s=600)


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


def make_executor(cluster: ClusterConfig, folder: Path, nodes: int, job_name: str):
    """A submitit executor for ``cluster`` whose jobs span ``nodes`` plan nodes."""
    import submitit

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    params = executor_parameters(cluster, nodes, job_name)
    executor: Any
    if cluster.executor is ExecutorKind.slurm:
        executor = SlurmExecutor(folder=folder, python=cluster.python or None)
    elif cluster.executor is ExecutorKind.debug:
        executor = submitit.DebugExecutor(folder=folder)
    else:
        executor = submitit.LocalExecutor(folder=folder, python=cluster.python or None)
    executor.update_parameters(**params)
    return executor
