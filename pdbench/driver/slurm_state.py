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


QUERY_TIMEOUT_S = 10
NO_ANSWER = "SLURM's controller did not answer"


def slurm_state(job_id: str) -> str:
    """A job's state from squeue, then scontrol (no accounting needed); '' when SLURM does
    not know the job. When the controller does not answer (down, unreachable, overloaded)
    scontrol, which asks the same controller, is not tried: the text says so, with squeue's
    own words, instead of reading as a job SLURM has forgotten."""
    if not shutil.which("squeue"):
        return ""
    for cmd in (
        ["squeue", "-h", "-j", job_id, "-o", "%T"],
        ["scontrol", "show", "job", job_id, "-o"],
    ):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return f"{NO_ANSWER} within {QUERY_TIMEOUT_S} s ({cmd[0]})"
        except (OSError, subprocess.SubprocessError):
            continue
        out = done.stdout.strip()
        if done.returncode != 0 and "contact slurm controller" in done.stderr.lower():
            return f"{NO_ANSWER} ({cmd[0]}: {done.stderr.strip().splitlines()[0]})"
        if not out:
            continue
        if cmd[0] == "squeue":
            return out.splitlines()[0]
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
    return ""


def live_jobs(job_ids: list[str]) -> dict[str, str]:
    """Job id -> state of those of ``job_ids`` SLURM still runs or will run (``LIVE_STATES``),
    from one ``squeue`` call ({} where there is no SLURM here)."""
    if not job_ids or not shutil.which("squeue"):
        return {}
    cmd = ["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    states = dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)
    return {j: states[j] for j in job_ids if states.get(j) in LIVE_STATES}
