"""``python -m pdbench status dir=RUN``: jobs, their states, Points done/failed/pending, logs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from pdbench.driver.leftovers import run_processes, stop_processes
from pdbench.driver.serve import serving_lines
from pdbench.driver.slurm_state import slurm_state
from pdbench.results.manifest import history_lines
from pdbench.results.store import CorruptRecord, RunStore
from records.manifest import JobEntry
from records.point import PointStatus
from records.versions import SchemaVersionError

POINT_STATES = ("ok", "failed", "corrupt", "pending")


def local_state(job_id: str) -> str:
    """A local job's state: its process (the job id is its pid) still runs, or not."""
    try:
        os.kill(int(job_id), 0)
    except (ValueError, ProcessLookupError):
        return "ended (local process gone; its Points below say how it went)"
    except PermissionError:
        pass
    return f"running (local process {job_id})"


def job_state(job: JobEntry) -> str:
    job_id = job.job_id
    if not job_id:
        return "unknown (the manifest's entry names no job id)"
    if job.executor == "local":
        return local_state(job_id)
    state = slurm_state(job_id) if job_id.isdigit() else ""
    return state or "not known to SLURM (ended and purged, or another cluster's)"


COMMAND_LINE = re.compile(r'"command_line":\s*"((?:[^"\\]|\\.)*)"')


def last_command_line(text: str) -> str:
    """The last launch's command line, read from a manifest's text even when it does not
    parse as a whole (a torn write keeps the lines before the tear)."""
    found = [m.group(1) for m in COMMAND_LINE.finditer(text)]
    found = [c for c in found if c]
    try:
        return json.loads(f'"{found[-1]}"') if found else ""
    except json.JSONDecodeError:
        return ""


def print_corrupt_manifest(store: RunStore, err: CorruptRecord) -> None:
    """What status can still say of a dir whose manifest does not parse: its Points, and the
    rerun that sets the manifest aside."""
    print(f"run in {store.root}: {err}")
    print("  its launches and jobs are unknown; the Points recorded in points/:")
    counts, notes = count_points(store, [p.stem for p in sorted(store.points_dir.glob("*.json"))])
    print(f"  {counts['ok']} ok, {counts['failed']} failed, {counts['corrupt']} corrupt")
    for note in notes:
        print(note)
    command = last_command_line(store.manifest_path.read_text(errors="replace"))
    rerun = command or "the command that made the run"
    print(
        f"  Fix: rerun {rerun} with dir={store.root} (a dry run first: launch.dry_run=true): "
        "the launch sets the corrupt manifest aside and starts a new one; Points recorded ok "
        "are skipped"
    )


def count_points(store: RunStore, point_ids: list[str]) -> tuple[dict[str, int], list[str]]:
    """Points by state, and a line for each failed or corrupt one."""
    counts = dict.fromkeys(POINT_STATES, 0)
    notes = []
    for pid in point_ids:
        try:
            rec = store.read_point(pid)
        except CorruptRecord as err:
            counts["corrupt"] += 1
            notes.append(f"    corrupt {err} (a rerun measures it again)")
            continue
        except SchemaVersionError as err:
            counts["newer"] = counts.get("newer", 0) + 1
            notes.append(f"    {err}")
            continue
        state = "pending" if rec is None else str(rec.status)
        counts[state] = counts.get(state, 0) + 1
        if rec is not None and rec.status != PointStatus.ok:
            first = rec.error.splitlines()[:1]
            notes.append(f"    failed {pid}: {first[0] if first else ''}")
    return counts, notes


def leftover_lines(store: RunStore) -> list[str]:
    """The run's processes alive on this machine: a live launch's servers, or left behind."""
    found = run_processes(store.root)
    if not found:
        return []
    holder = store.held_by()
    head = (
        f"  processes of the launch that follows this dir ({holder}):"
        if holder
        else f"  left behind, holding their ports (end them: python -m pdbench stop "
        f"dir={store.root}):"
    )
    return [head, *(f"    {p.describe()}" for p in found)]


def stop_leftovers(run_dir: str) -> None:
    """``python -m pdbench stop``: end the run's processes on this machine, unless a launch
    still follows the dir (stopping that launch stops its jobs and their servers)."""
    store = RunStore(run_dir)
    holder = store.held_by()
    if holder is not None:
        raise SystemExit(
            f"dir={run_dir}: a launch follows this dir ({holder}). Fix: stop that launch "
            "(Ctrl-C, or kill its pid): it stops its jobs and their servers"
        )
    found = run_processes(store.root)
    if not found:
        print(f"[pdbench] nothing of {store.root} is alive on this machine")
        return
    for p in found:
        print(f"[pdbench] stopping {p.describe()}", flush=True)
    left = stop_processes(found)
    if left:
        raise SystemExit(f"[pdbench] still alive (not this user's to signal?): pids {left}")
    print(f"[pdbench] {len(found)} process(es) of {store.root} stopped")


def print_status(run_dir: str) -> None:
    store = RunStore(run_dir)
    if not store.manifest_path.exists():
        raise SystemExit(
            f"dir={run_dir}: no manifest.json there. Fix: pass the run directory "
            "that `python -m pdbench` printed (results/<name>-<time>)."
        )
    try:
        manifest = store.manifest()
    except CorruptRecord as err:
        print_corrupt_manifest(store, err)
        return
    except SchemaVersionError as err:
        raise SystemExit(f"dir={run_dir}: {err}") from None
    print(f"run {manifest.name} in {store.root}")
    print("\n".join(history_lines(manifest)))
    for line in leftover_lines(store):
        print(line)
    for line in serving_lines(store.root):
        print(line)
    for job in manifest.jobs:
        print(f"  job {job.job_id or '?'} ({job.deployment_id or '?'}): {job_state(job)}")
        print(f"    logs: {job.stdout or '?'}  {job.stderr or '?'}")
    for dep in manifest.deployments:
        dep_id = dep.deployment_id or "?"
        points = list(dep.points)
        counts, notes = count_points(store, points)
        corrupt = f"{counts['corrupt']} corrupt, " if counts["corrupt"] else ""
        print(
            f"  deployment {dep_id}: {counts['ok']} ok, {counts['failed']} failed, "
            f"{corrupt}{counts['pending']} pending of {len(points)}"
        )
        print(f"    server logs: {Path(store.logs_dir(dep_id))}")
        for note in notes:
            print(note)
