"""What is submitted, as data: submitit executor keywords and the sbatch script text.

``executor_parameters`` gives the keywords ``pdbench.driver.executors.make_executor`` hands its
executor; ``sbatch_script`` builds, with submitit's own sbatch builder and those
keywords, exactly the file ``sbatch`` receives (the launch spec keeps it; the dry run prints
it). Pure: no process is started and nothing is written.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Any

from pdbench.config.schema import ClusterConfig, ExecutorKind
from pdbench.plan.attempt import signal_delay_s
from pdbench.spec import containers
from pdbench.spec.submitit_private import SUBMIT_MODULE, make_sbatch_string

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# With cluster.cpus_per_task 0 on whole nodes (exclusive, or GPU nodes): srun gives each task
# every core SLURM allocated on the node (srun reads SRUN_CPUS_PER_TASK; the batch script
# knows the node's count at run time), instead of a number fixed in the config that the next
# site's nodes do not have.
ALL_CORES_SETUP = "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_ON_NODE}"


def env_exports(env: dict[str, str]) -> list[str]:
    """Shell lines exporting ``env`` (values quoted), in the mapping's order."""
    lines = []
    for key, value in env.items():
        if not _ENV_NAME.match(str(key)):
            raise ValueError(f"cluster.env: {key!r} is not a valid environment variable name")
        lines.append(f"export {key}={shlex.quote(str(value))}")
    return lines


def slurm_parameters(
    cluster: ClusterConfig, nodes: int, job_name: str, tasks_per_node: int = 1
) -> dict[str, Any]:
    """``submitit.SlurmExecutor.update_parameters`` keywords (its native, sbatch-like names);
    one task per node but for the transfer bench over a link inside a node (two)."""
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": cluster.time_limit_min,
        "nodes": nodes,
        "ntasks_per_node": tasks_per_node,
        "signal_delay_s": signal_delay_s(cluster.time_limit_min, cluster.signal_delay_s),
        "array_parallelism": cluster.array_parallelism,
    }
    if cluster.gpus_per_node:
        params["gpus_per_node"] = cluster.gpus_per_node
    # submitit writes "#SBATCH --wckey=submitit" unless told None: sites that enforce
    # wckeys reject it. Only a configured wckey goes to SLURM.
    params["wckey"] = cluster.wckey or None
    cpus = cluster.cpus_per_task or cluster.cpus_per_node
    srun: list[str] = []
    if cpus:
        params["cpus_per_task"] = cpus
        # srun 22.05-23.02 ignores the batch script's --cpus-per-task: repeat it for the step.
        srun.append(f"--cpus-per-task={cpus}")
    # pyxis container options (srun's, not sbatch's), then cluster.srun_args.
    srun += containers.srun_args(cluster)
    if srun:
        params["srun_args"] = srun
    if cluster.mem_gb:
        params["mem"] = f"{cluster.mem_gb}GB"
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(cluster, key)
        if value:
            params[key] = value
    if cluster.exclusive:
        params["exclusive"] = True
    # submitit writes --open-mode=append itself (a requeued job appends to its logs). A job
    # pdbench submits asks to be requeueable (--requeue): where a site sets JobRequeue=0,
    # `scontrol requeue` (submitit's, at the time limit) refuses a job submitted without it.
    # Then the site's own extra options, which win.
    params["additional_parameters"] = {"requeue": True, **dict(cluster.additional_parameters)}
    setup = list(cluster.setup) + env_exports(dict(cluster.env))
    if not cpus and (cluster.exclusive or cluster.gpus_per_node):
        setup.append(ALL_CORES_SETUP)
    if setup:
        params["setup"] = setup
    return params


def local_parameters(
    cluster: ClusterConfig,
    nodes: int,
    job_name: str,
    visible_gpus: tuple[int, ...] = (),
    tasks_per_node: int = 1,
) -> dict[str, Any]:
    """``submitit.LocalExecutor.update_parameters`` keywords: N tasks on this machine.

    submitit's local controller sets its tasks' ``CUDA_VISIBLE_DEVICES`` to the GPUs asked for,
    and to none when none are: ``cluster.gpus_per_node`` of them, the first of ``visible_gpus``
    (the driver's own ``CUDA_VISIBLE_DEVICES``) where it names some."""
    params: dict[str, Any] = {
        "name": job_name,
        "timeout_min": cluster.time_limit_min,
        "tasks_per_node": nodes * tasks_per_node,
        "signal_delay_s": signal_delay_s(cluster.time_limit_min, cluster.signal_delay_s),
    }
    if cluster.gpus_per_node > 0:
        params["gpus_per_node"] = cluster.gpus_per_node
        if visible_gpus:
            if len(visible_gpus) < cluster.gpus_per_node:
                raise ValueError(
                    f"cluster.gpus_per_node={cluster.gpus_per_node} but CUDA_VISIBLE_DEVICES "
                    f"names {len(visible_gpus)} GPU(s) ({','.join(map(str, visible_gpus))}): "
                    "set cluster.gpus_per_node to at most that, or make more GPUs visible"
                )
            params["visible_gpus"] = tuple(visible_gpus)
    setup = list(cluster.setup) + env_exports(dict(cluster.env))
    if setup:
        params["setup"] = setup
    return params


def executor_parameters(
    cluster: ClusterConfig,
    nodes: int,
    job_name: str,
    visible_gpus: tuple[int, ...] = (),
    tasks_per_node: int = 1,
) -> dict[str, Any]:
    """The ``update_parameters`` keywords of ``make_executor``'s executor for ``nodes`` nodes
    (``visible_gpus``: the local executor's, ``local_parameters``)."""
    if nodes < 1:
        raise ValueError(f"a job needs at least one node, got nodes={nodes}")
    if cluster.executor is ExecutorKind.slurm:
        return slurm_parameters(cluster, nodes, job_name, tasks_per_node)
    if cluster.executor is ExecutorKind.debug:
        return {"name": job_name, "timeout_min": cluster.time_limit_min}
    return local_parameters(cluster, nodes, job_name, visible_gpus, tasks_per_node)


def submitit_command(folder: str | Path, python: str = "") -> str:
    """The command submitit's SLURM executor runs in each task (``python``: "" for this one)."""
    python = python or shlex.quote(sys.executable)
    return f"{python} -u -m {SUBMIT_MODULE} {shlex.quote(str(folder))}"


def sbatch_script(
    cluster: ClusterConfig,
    nodes: int,
    job_name: str,
    folder: str | Path,
    command: str | None = None,
    array_size: int = 1,
    tasks_per_node: int = 1,
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
    params = slurm_parameters(cluster, nodes, job_name, tasks_per_node)
    if array_size > 1:
        params["map_count"] = array_size
    return make_sbatch_string(command=command, folder=folder, **params)
