"""``python -m pdbench status dir=RUN``: jobs, their states, Points done/failed/pending, logs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from pdbench.results import RunStore


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


def print_status(run_dir: str) -> None:
    store = RunStore(run_dir)
    if not (store.root / "manifest.json").exists():
        raise SystemExit(
            f"dir={run_dir}: no manifest.json there. Fix: pass the run directory "
            "that `python -m pdbench` printed (results/<name>-<time>)."
        )
    manifest = store.read_manifest()
    print(f"run {manifest.get('name')} in {store.root}")
    for job in manifest.get("jobs", []):
        state = slurm_state(job["job_id"]) if job["job_id"].isdigit() else ""
        print(f"  job {job['job_id']} ({job['deployment_id']}): {state or 'not queued'}")
        print(f"    logs: {job['stdout']}  {job['stderr']}")
    for dep in manifest.get("deployments", []):
        counts = {"ok": 0, "failed": 0, "pending": 0}
        for pid in dep["points"]:
            counts[store.point_status(pid)] = counts.get(store.point_status(pid), 0) + 1
        print(
            f"  deployment {dep['deployment_id']}: {counts['ok']} ok, {counts['failed']} failed, "
            f"{counts['pending']} pending of {len(dep['points'])}"
        )
        print(f"    server logs: {Path(store.logs_dir(dep['deployment_id']))}")
        for pid in dep["points"]:
            rec = store.read_point(pid)
            if rec and rec.get("status") == "failed":
                first = (rec.get("error") or "").splitlines()[:1]
                print(f"    failed {pid}: {first[0] if first else ''}")
