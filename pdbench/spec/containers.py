"""pyxis containers for SLURM tasks: the srun options a ClusterConfig asks for (pure).

pyxis is a SLURM SPANK plugin: its options go on ``srun`` (not ``sbatch``):
``--container-image=IMAGE`` (an enroot URI ``[USER@][REGISTRY#]IMAGE[:TAG]`` or a squashfs
path), ``--container-mounts=SRC:DST[:FLAGS][,SRC:DST...]`` (flags joined by ``+``),
``--container-workdir=PATH``; with them every task of the step runs in the container.
"""

from __future__ import annotations

from pdbench.config.schema import ClusterConfig

# srun options pdbench (submitit) sets itself, or that have their own ClusterConfig field.
RESERVED_SRUN_OPTIONS = {
    "--output": "set by submitit (logs under <run dir>/submitit)",
    "-o": "set by submitit (logs under <run dir>/submitit)",
    "--error": "set by submitit (logs under <run dir>/submitit)",
    "-e": "set by submitit (logs under <run dir>/submitit)",
    "--unbuffered": "set by submitit",
    "-u": "set by submitit",
    "--cpus-per-task": "use cluster.cpus_per_task",
    "-c": "use cluster.cpus_per_task",
    "--container-image": "use cluster.container_image",
    "--container-mounts": "use cluster.container_mounts",
    "--container-workdir": "use cluster.container_workdir",
}


def option_name(arg: str) -> str:
    """``--container-image`` of ``--container-image=x``."""
    return arg.split("=", 1)[0]


def parse_mount(mount: str) -> tuple[str, str, str] | None:
    """(src, dst, flags) of ``SRC:DST[:FLAGS]``; None when malformed."""
    parts = mount.split(":")
    if len(parts) not in (2, 3) or "," in mount or not all(parts[:2]):
        return None
    src, dst = parts[0], parts[1]
    flags = parts[2] if len(parts) == 3 else ""
    if len(parts) == 3 and not flags:
        return None
    return src, dst, flags


def container_srun_args(cluster: ClusterConfig) -> list[str]:
    """The srun options that run every task in ``cluster.container_image`` (pyxis)."""
    if not cluster.container_image:
        return []
    args = [f"--container-image={cluster.container_image}"]
    if cluster.container_mounts:
        args.append("--container-mounts=" + ",".join(cluster.container_mounts))
    if cluster.container_workdir:
        args.append(f"--container-workdir={cluster.container_workdir}")
    return args


def srun_args(cluster: ClusterConfig) -> list[str]:
    """Every srun option a task step gets from the config: containers, then ``srun_args``."""
    return container_srun_args(cluster) + list(cluster.srun_args)
