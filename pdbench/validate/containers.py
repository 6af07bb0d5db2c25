"""Validation of pyxis containers (pure): SLURM only, well-formed mounts, an interpreter the
image has, and extra srun options that do not fight the ones pdbench sets."""

from __future__ import annotations

import sys

from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import ExecutorKind, RunConfig
from pdbench.spec.containers import RESERVED_SRUN_OPTIONS, option_name, parse_mount


def check_containers(cfg: RunConfig) -> list[ConfigProblem]:
    """pyxis container fields: SLURM only, well-formed mounts, an interpreter the image has,
    and extra srun options that do not fight the ones pdbench sets."""
    c = cfg.cluster
    out = Problems()
    if not c.container_image:
        for name, value in (
            ("container_mounts", c.container_mounts),
            ("container_workdir", c.container_workdir),
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
    if c.container_image and not c.python:
        here = sys.executable
        if not any(src == dst and here.startswith(src.rstrip("/") + "/") for src, dst, _ in mounts):
            out.add(
                "cluster.python",
                "''",
                f"means the driver's interpreter {here}, which the container image does not "
                "have unless a mount brings it at the same path",
                "cluster.python=python (the image's, with pdbench's requirements), or mount "
                "the venv's directory at the same path",
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
