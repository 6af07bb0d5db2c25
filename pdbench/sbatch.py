"""The sbatch script a SLURM job would be submitted with, as text: for ``launch.dry_run=true``.

Built by submitit's own ``_make_sbatch_string`` from the same keywords ``make_executor``
gives ``SlurmExecutor``, so the text is exactly what ``sbatch`` would receive. Pure: no
process is started and nothing is written.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from submitit.slurm.slurm import _make_sbatch_string

from pdbench.config import ClusterConfig, ExecutorKind
from pdbench.executors import slurm_parameters


def submitit_command(folder: str | Path, python: str = "") -> str:
    """The command submitit's SLURM executor runs in each task (``python``: "" for this one)."""
    python = python or shlex.quote(sys.executable)
    return f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}"


def sbatch_script(
    cluster: ClusterConfig,
    nodes: int,
    job_name: str,
    folder: str | Path,
    command: str | None = None,
    array_size: int = 1,
) -> str:
    """The sbatch file submitting a job of ``nodes`` nodes to ``cluster`` from ``folder``.

    ``command`` defaults to submitit's task command (``cluster.python``, or this interpreter).
    ``array_size`` > 1: one array job of that many elements, as ``executor.map_array`` makes.
    """
    if cluster.executor is not ExecutorKind.slurm:
        raise ValueError(
            f"cluster {cluster.name!r} uses executor {cluster.executor.value!r}: "
            "only executor=slurm submits an sbatch script"
        )
    if array_size < 1:
        raise ValueError(f"array_size must be at least 1, got {array_size}")
    folder = Path(folder)
    if command is None:
        command = submitit_command(folder, cluster.python)
    params = slurm_parameters(cluster, nodes, job_name)
    if array_size > 1:
        params["map_count"] = array_size
    return _make_sbatch_string(command=command, folder=folder, **params)
