"""A SLURM job's state as SLURM says it now, without accounting (``squeue``, then
``scontrol``): what ``status`` prints and what a relaunch into a run dir checks first."""

from __future__ import annotations

import shutil
import subprocess

# States of a job that still holds or will hold nodes (squeue's long names).
LIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SUSPENDED",
        "STAGE_OUT",
    }
)


def slurm_state(job_id: str) -> str:
    """A job's state from squeue, then scontrol (no accounting needed); '' when unknown."""
    if not shutil.which("squeue"):
        return ""
    for cmd in (
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        ["scontrol", "show", "job", job_id, "-o"],
    ):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if not out:
            continue
        if cmd[0] == "squeue":
            return out.splitlines()[0]
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
    return ""
