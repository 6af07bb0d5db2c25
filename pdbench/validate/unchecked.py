"""What the driver cannot check from here: said before the launch rather than refused.

A model directory on a SLURM cluster usually lives on a filesystem the nodes mount and this
login node may not (``pdbench.validate.gpu.check_model_reachable`` refuses the ones it can
see are missing). The rest is checked by each job's preflight on its nodes before any
server starts; the warning says so, or that nothing will when ``launch.preflight=false``.
"""

from __future__ import annotations

from pathlib import Path

from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import ExecutorKind, RunConfig
from pdbench.validate.model_source import is_local_path


def warn_model_path_checked_on_the_nodes(cfg: RunConfig) -> list[ConfigProblem]:
    """A SLURM model directory this machine does not see: who checks it, and when."""
    m = cfg.model
    if cfg.cluster.executor is not ExecutorKind.slurm or m.generate or not is_local_path(m.path):
        return []
    if Path(m.path).expanduser().exists():
        return []
    if cfg.launch.preflight:
        return [
            ConfigProblem(
                "model.path",
                m.path,
                "is not on this machine; each job's preflight checks it on its nodes before "
                "any server starts (a missing one fails the Deployment in one line)",
                "nothing, if the nodes mount it; python -m pdbench preflight ... checks now",
            )
        ]
    return [
        ConfigProblem(
            "model.path",
            m.path,
            "is not on this machine and launch.preflight=false: nothing checks it before the "
            "servers try to load it",
            "launch.preflight=true, or make sure every node mounts it",
        )
    ]
