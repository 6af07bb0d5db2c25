"""``python -m pdbench status dir=RUN``: jobs, their states, Points done/failed/pending, logs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from pdbench.results.manifest import history_lines
from pdbench.results.store import CorruptRecord, RunStore

POINT_STATES = ("ok", "failed", "corrupt", "pending")


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


def local_state(job_id: str) -> str:
    """A local job's state: its process (the job id is its pid) still runs, or not."""
    try:
        os.kill(int(job_id), 0)
    except (ValueError, ProcessLookupError):
        return "ended (local process gone; its Points below say how it went)"
    except PermissionError:
        pass
    return f"running (local process {job_id})"


def job_state(job: dict) -> str:
    if job.get("executor") == "local":
        return local_state(job["job_id"])
    state = slurm_state(job["job_id"]) if job["job_id"].isdigit() else ""
    return state or "not known to SLURM (ended and purged, or another cluster's)"


def print_status(run_dir: str) -> None:
    store = RunStore(run_dir)
    if not (store.root / "manifest.json").exists():
        raise SystemExit(
            f"dir={run_dir}: no manifest.json there. Fix: pass the run directory "
            "that `python -m pdbench` printed (results/<name>-<time>)."
        )
    try:
        manifest = store.read_manifest()
    except CorruptRecord as err:
        raise SystemExit(f"{err}. Fix: rerun the same command to rewrite it") from err
    print(f"run {manifest.get('name')} in {store.root}")
    print("\n".join(history_lines(manifest)))
    for job in manifest.get("jobs", []):
        print(f"  job {job['job_id']} ({job['deployment_id']}): {job_state(job)}")
        print(f"    logs: {job['stdout']}  {job['stderr']}")
    for dep in manifest.get("deployments", []):
        counts = dict.fromkeys(POINT_STATES, 0)
        notes = []
        for pid in dep["points"]:
            try:
                rec = store.read_point(pid)
            except CorruptRecord as err:
                counts["corrupt"] += 1
                notes.append(f"    corrupt {err} (a rerun measures it again)")
                continue
            state = "pending" if rec is None else str(rec.get("status", "failed"))
            counts[state] = counts.get(state, 0) + 1
            if state == "failed":
                first = (rec.get("error") or "").splitlines()[:1]
                notes.append(f"    failed {pid}: {first[0] if first else ''}")
        corrupt = f"{counts['corrupt']} corrupt, " if counts["corrupt"] else ""
        print(
            f"  deployment {dep['deployment_id']}: {counts['ok']} ok, {counts['failed']} failed, "
            f"{corrupt}{counts['pending']} pending of {len(dep['points'])}"
        )
        print(f"    server logs: {Path(store.logs_dir(dep['deployment_id']))}")
        for note in notes:
            print(note)
