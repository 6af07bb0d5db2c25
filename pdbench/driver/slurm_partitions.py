"""The partition a SLURM run asks for, checked against what ``sinfo`` lists (where it answers),
before anything is submitted: a name SLURM does not know is one line with the choices, not
sbatch's error inside a traceback after the launch began."""

from __future__ import annotations

import shutil
import subprocess

from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import ExecutorKind, RunConfig


def partitions(sinfo_out: str) -> tuple[list[str], str]:
    """The partitions of ``sinfo -h -o %P`` output, and the default one ("" if none marked)."""
    names, default = [], ""
    for line in sinfo_out.split():
        name = line.strip()
        if name.endswith("*"):
            name = name[:-1]
            default = default or name
        if name and name not in names:
            names.append(name)
    return names, default


def partition_problem(cfg: RunConfig) -> ConfigProblem | None:
    """``cluster.partition`` SLURM does not have (None: it does, none is named, or ``sinfo``
    does not answer here: the submission will say)."""
    c = cfg.cluster
    if c.executor is not ExecutorKind.slurm or not c.partition or shutil.which("sinfo") is None:
        return None
    try:
        probe = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if probe.returncode != 0:
        return None
    names, default = partitions(probe.stdout)
    if not names or c.partition in names:
        return None
    fix = f"cluster.partition={default or names[0]}"
    return ConfigProblem(
        "cluster.partition",
        c.partition,
        f"is not a partition of this SLURM cluster (sinfo lists {', '.join(names)})",
        fix + (" (the default)" if default else ""),
    )
