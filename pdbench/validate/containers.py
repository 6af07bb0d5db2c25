"""Validation of pyxis containers (pure): SLURM only, well-formed mounts, an interpreter the
image has, and extra srun options that do not fight the ones pdbench sets.

What a task in a container runs is the image's unless a mount brings it: an NGC or vLLM
image has no submitit, pdbench, vLLM 0.32.0 or NIXL, and pyxis lets the image's PATH win
over the batch script's. ``cluster.setup`` runs in the batch script on the host, before srun
starts the container: a venv it activates never reaches the tasks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import Command, ExecutorKind, RunConfig
from pdbench.plan.attempt import attempt, job_points
from pdbench.plan.deployments import make_plan
from pdbench.plan.lengths import longest_history
from pdbench.spec.containers import (
    IMAGE_RECIPE,
    RESERVED_SRUN_OPTIONS,
    activates_environment,
    option_name,
    parse_mount,
)
from pdbench.validate.model_source import is_local_path


def check_containers(cfg: RunConfig) -> list[ConfigProblem]:
    """pyxis container fields: SLURM only, well-formed mounts, an interpreter the image has,
    and extra srun options that do not fight the ones pdbench sets."""
    c = cfg.cluster
    out = Problems()
    if not c.container_image:
        for name, value in (
            ("container_mounts", c.container_mounts),
            ("container_workdir", c.container_workdir),
            ("container_has_pdbench", c.container_has_pdbench),
        ):
            if value:
                out.add(
                    f"cluster.{name}",
                    value,
                    "has no effect without cluster.container_image",
                    "set cluster.container_image, or drop it",
                )
    elif c.executor is not ExecutorKind.slurm:
        out.add(
            "cluster.container_image",
            c.container_image,
            f"runs tasks in a pyxis container, an srun option, but cluster.executor is "
            f"{c.executor.value}",
            "cluster=slurm (or a copy of h100_8gpu.yaml), or container_image ''",
        )
    mounts = []
    for mount in c.container_mounts:
        parsed = parse_mount(mount)
        if parsed is None or not parsed[0].startswith("/") or not parsed[1].startswith("/"):
            out.add(
                "cluster.container_mounts",
                mount,
                "is not SRC:DST[:FLAGS] with absolute paths (pyxis --container-mounts; flags "
                "joined by '+', mounts are list items, not comma-joined)",
                "e.g. /lustre/me/pdbench:/lustre/me/pdbench or /models:/models:ro",
            )
        else:
            mounts.append(parsed)
    if c.container_image:
        out += _container_interpreter(c.python, c.container_has_pdbench, mounts)
        out += _paths_mounted(cfg, mounts)
        for line in c.setup:
            if activates_environment(line):
                out.add(
                    "cluster.setup",
                    line,
                    "runs in the batch script on the host, before srun starts the container: "
                    "the environment it activates never reaches the tasks (pyxis lets the "
                    "image's PATH win)",
                    "drop it: the tasks run cluster.python inside the image",
                )
    for arg in c.srun_args:
        name = option_name(arg)
        if not arg.startswith("-"):
            out.add("cluster.srun_args", arg, "is not an option (starts with -)", "e.g. --mpi=none")
        elif name in RESERVED_SRUN_OPTIONS:
            out.add(
                "cluster.srun_args",
                arg,
                f"is an srun option pdbench sets itself ({RESERVED_SRUN_OPTIONS[name]})",
                RESERVED_SRUN_OPTIONS[name]
                if "cluster." in RESERVED_SRUN_OPTIONS[name]
                else "drop it",
            )
    return out


def check_container_requeue(cfg: RunConfig) -> list[ConfigProblem]:
    """A job in a container cannot requeue itself at its time limit unless the image has
    SLURM's client (submitit runs ``scontrol requeue`` in the task; pyxis #129): a run whose
    largest job needs more than one attempt by the estimate (``pdbench.plan.attempt``) is
    refused, with the time limit that holds it, unless ``cluster.container_has_slurm``."""
    c = cfg.cluster
    out = Problems()
    if not c.container_image or c.container_has_slurm or cfg.command is not Command.run:
        return out
    if c.executor is not ExecutorKind.slurm:
        return out
    plan = make_plan(cfg)
    if not plan.deployments:
        return out
    most = max(job_points(plan, d.deployment_id) for d in plan.deployments)
    one = attempt(cfg, longest_history(cfg), most)
    if one.points is None or one.points >= most:
        return out
    out.add(
        "cluster.container_image",
        c.container_image,
        f"runs each task in an image without SLURM's client, so a job cannot requeue itself "
        f"at its time limit, and the largest job ({most} Points, about {one.point_s:.0f} s "
        f"each: {one.basis}) needs about {one.attempts} attempts of {c.time_limit_min} min",
        f"cluster.time_limit_min={one.limit_min_for(most)} (one attempt holds it), fewer "
        "Points per job, or an image with scontrol for this cluster and "
        "cluster.container_has_slurm=true",
    )
    return out


def _mounted(path: str, mounts: list[tuple[str, str, str]]) -> bool:
    """``path`` is under (or is) a mount that brings a host directory at its own path."""
    path = path.rstrip("/") or "/"
    return any(
        src == dst and (path == src.rstrip("/") or path.startswith(src.rstrip("/") + "/"))
        for src, dst, _ in mounts
    )


def _paths_mounted(cfg: RunConfig, mounts: list[tuple[str, str, str]]) -> list[ConfigProblem]:
    """What a task reads and writes in the container at the driver's paths: the run dir (it
    unpickles its job there first: unmounted, it dies before pdbench can say why), a model
    directory, and the hub cache ``HF_HOME`` names."""
    c = cfg.cluster
    wanted = [("dir", str(Path(cfg.dir).expanduser().resolve()), "the run dir")]
    if cfg.model.path and not cfg.model.generate and is_local_path(cfg.model.path):
        wanted.append(("model.path", cfg.model.path, "the model's directory"))
    hf_home = {**c.env, **cfg.server.env}.get("HF_HOME", "")
    if hf_home and hf_home.startswith("/"):
        wanted.append(("cluster.env.HF_HOME", hf_home, "the hub cache the servers read"))
    out = Problems()
    for field, path, what in wanted:
        if not _mounted(path, mounts):
            out.add(
                field,
                path,
                f"is {what}, which a task in the container reads at this path, and no "
                "cluster.container_mounts entry brings it there",
                f"add '{_mount_root(path)}:{_mount_root(path)}' to cluster.container_mounts "
                "(the directory above it every node shares, at its own path)",
            )
    return out


def _mount_root(path: str) -> str:
    """The first two levels of ``path`` (``/lustre/me`` of ``/lustre/me/runs/x``): what a
    site usually mounts whole."""
    parts = [p for p in path.split("/") if p]
    return "/" + "/".join(parts[:2]) if parts else "/"


def _container_interpreter(
    python: str, has_pdbench: bool, mounts: list[tuple[str, str, str]]
) -> list[ConfigProblem]:
    """The tasks' interpreter exists in the container, with pdbench and its stack: a venv
    mounted at its own path, or an image that holds them (``container_has_pdbench``)."""
    here = sys.executable
    image_fix = (
        f"build the image from {IMAGE_RECIPE} (docs/gpu.md, 'Containers') and set "
        "cluster.container_has_pdbench=true cluster.python=python3"
    )
    if not python:
        if _mounted(here, mounts):
            return []
        return [
            ConfigProblem(
                "cluster.python",
                "''",
                f"means the driver's interpreter {here}, which the container image does not "
                "have unless a mount brings it at the same path",
                f"{image_fix}; or mount the venv's directory at the same path",
            )
        ]
    if has_pdbench or _mounted(python, mounts):
        return []
    return [
        ConfigProblem(
            "cluster.python",
            python,
            "runs the image's interpreter, and an image not built for pdbench has no "
            "submitit, pdbench, vLLM 0.32.0 or NIXL: the tasks would not start",
            f"{image_fix}; or mount the driver's venv at its own path and set "
            f"cluster.python={here}",
        )
    ]
