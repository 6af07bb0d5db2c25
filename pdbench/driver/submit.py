"""Submit jobs and follow them to their end: the one way every command does (a run's
Deployments, a sweep's runs, the transfer bench, the preflight alone).

``submit`` hands callables to submitit (several at once: one SLURM array) and says each
job's id; ``follow`` echoes the jobs' ``[pdbench]`` lines until all have ended and returns
each one's ``JobOutcome``; a job whose ``stop_after`` says so (``launch.on_failure=stop``)
cancels the others.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdbench.config.schema import ClusterConfig
from pdbench.driver.executors import make_executor
from pdbench.driver.progress import JobOutcome, follow_all


@dataclass
class Submitted:
    """One submitted job and what it runs."""

    label: str  # a Deployment id, "transfer bench", "preflight"
    job: Any  # the submitit job
    # launch.on_failure: True when this job's outcome ends the run (the others are cancelled)
    stop_after: Callable[[JobOutcome], bool] | None = None


def check_slurm_reachable() -> None:
    """Fail before submitting anything when no SLURM controller answers."""
    if shutil.which("sinfo") is None:
        raise SystemExit(
            "cluster.executor=slurm but there is no `sinfo` here. Fix: run on a SLURM login "
            "node, or start the local test cluster with `scripts/local-slurm.sh start`."
        )
    probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SystemExit(
            f"cluster.executor=slurm but SLURM does not answer ({probe.stderr.strip()}). Fix: "
            "check SLURM_CONF / the controller, or `scripts/local-slurm.sh start` locally."
        )


def submit(
    cluster: ClusterConfig,
    folder: Path,
    nodes: int,
    job_name: str,
    work: list[tuple[str, Callable[[], Any]]],
    sbatch: str = "",
) -> list[Submitted]:
    """Submit each ``(label, callable)`` as a job of ``nodes`` plan nodes (several: one array
    on SLURM). ``sbatch``: the script the launch spec holds, checked against what SLURM got."""
    executor = make_executor(cluster, folder, nodes, job_name)
    if len(work) == 1:
        jobs = [executor.submit(work[0][1])]
    else:
        with executor.batch():
            jobs = [executor.submit(fn) for _, fn in work]
    if sbatch:
        check_submitted_sbatch(jobs[0], sbatch)
    submitted = [Submitted(label, job) for (label, _), job in zip(work, jobs, strict=True)]
    for s in submitted:
        print(f"[pdbench] submitted {s.label} as job {s.job.job_id}", flush=True)
    return submitted


def follow(submitted: list[Submitted], recorded: Callable[[], str]) -> list[JobOutcome]:
    """Follow the jobs together to their end (``pdbench.driver.progress``); ``recorded()``
    says how far the work is (e.g. "2/6 points")."""

    def on_finished(i: int, outcome: JobOutcome) -> bool:
        stop = submitted[i].stop_after
        return stop is not None and stop(outcome)

    return follow_all([s.job for s in submitted], recorded, on_finished=on_finished)


def check_submitted_sbatch(job, planned: str) -> None:
    """Say so loudly if the sbatch file submitit gave SLURM is not the one the spec holds
    (and the dry run printed): a submitit upgrade that changed it, for instance."""
    path = Path(job.paths.submission_file)
    try:
        submitted = path.read_text()
    except OSError:
        return
    if submitted != planned:
        print(
            f"[pdbench] WARNING: the sbatch file SLURM got ({path}) differs from the launch "
            "spec's (what launch.dry_run=true prints); check the submitit version",
            flush=True,
        )
