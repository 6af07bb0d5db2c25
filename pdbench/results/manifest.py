"""The run dir's manifest: the experiment a dir holds and every launch into it.

``manifest.json``::

    name, created_at, config, model_path, provenance   the dir's first launch: its experiment
    launches   every launch, appended: at, name, command_line, invocation, config,
               model_path, provenance (a resume, a requeue's driver, each job of a -m sweep)
    deployments, jobs, updated_at                      (pdbench.driver.launch)

A launch whose measured config (``pdbench.results.identity``) matches none of the dir's launches is
refused (``mixed_launch_problem``), unless it comes from the same ``python -m pdbench``
process as one of them (the jobs of one ``-m`` sweep share a dir and differ by the swept
keys) or ``launch.allow_mixed=true``. Pure: the caller reads and writes the file.
"""

from __future__ import annotations

import shlex
import time
import uuid
from dataclasses import dataclass
from typing import Any

from pdbench.config.problems import ConfigProblem
from pdbench.results.identity import differences, measured_config, operational_config
from records.manifest import Launch, Manifest
from records.versions import MANIFEST_SCHEMA

SHOWN_DIFFERENCES = 12  # keys listed in a refusal; the rest counted


@dataclass(frozen=True)
class LaunchOrigin:
    """Where a launch comes from: its command line, and the id of the ``python -m pdbench``
    process that made it (every job of one ``-m`` sweep shares it)."""

    command_line: str
    invocation: str

    @classmethod
    def of(cls, argv: list[str]) -> LaunchOrigin:
        """A new invocation for ``python -m pdbench ARGV``."""
        return cls(shlex.join(["python", "-m", "pdbench", *argv]), uuid.uuid4().hex[:12])


def launches(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The dir's launches, oldest first; a manifest written before the history kept one.
    Entries that are not objects are left out; each has a ``config`` (``{}`` if it lost it)."""
    if "launches" in manifest:
        kept = [launch for launch in manifest["launches"] or [] if isinstance(launch, dict)]
        return [{**launch, "config": launch.get("config") or {}} for launch in kept]
    if "config" not in manifest:
        return []
    return [
        {
            "at": manifest.get("created_at", 0.0),
            "name": manifest.get("name", ""),
            "command_line": "",
            "invocation": "",
            "config": manifest["config"],
            "model_path": manifest.get("model_path", ""),
            "provenance": manifest.get("provenance", {}),
        }
    ]


def when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) if at else "?"


def describe_launch(number: int, launch: Launch) -> str:
    """``launch 2 (2025-01-02 10:00:01, host, git abc1234): python -m pdbench ...``"""
    prov = launch.provenance
    where = ", ".join(
        x
        for x in (
            when(launch.at),
            prov.hostname,
            f"git {prov.git_sha[:10]}" if prov.git_sha else "",
        )
        if x
    )
    command = launch.command_line or "(command line not recorded)"
    return f"launch {number} ({where}): {command}"


def _value(v: Any) -> str:
    return "(unset)" if v is None else repr(v) if isinstance(v, str) else str(v)


def changes(old_config: dict[str, Any], new_config: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for every measured and operational setting that differs."""
    old = {**measured_config(old_config), **operational_config(old_config)}
    new = {**measured_config(new_config), **operational_config(new_config)}
    return [f"{k}: {_value(a)} -> {_value(b)}" for k, a, b in differences(old, new)]


def mixed_launch_problem(
    manifest: Manifest, config: dict[str, Any], origin: LaunchOrigin, run_dir: str
) -> ConfigProblem | None:
    """Why a launch of ``config`` (JSON) must not go into a dir holding ``manifest``; None
    when its measured config is one of the dir's launches', or the same invocation made one."""
    history = manifest.history()
    if not history:
        return None
    new = measured_config(config)
    if any(measured_config(launch.config) == new for launch in history):
        return None
    if any(launch.invocation == origin.invocation for launch in history):
        return None
    diffs = [differences(measured_config(launch.config), new) for launch in history]
    closest = min(range(len(history)), key=lambda i: len(diffs[i]))
    shown = [
        f"    {key}: {_value(old)} (dir) -> {_value(value)} (this launch)"
        for key, old, value in diffs[closest][:SHOWN_DIFFERENCES]
    ]
    more = len(diffs[closest]) - SHOWN_DIFFERENCES
    if more > 0:
        shown.append(f"    ... and {more} more")
    return ConfigProblem(
        field="dir",
        value=run_dir,
        message=(
            f"the run dir holds another experiment: none of its {len(history)} launch(es) "
            "measured this config. Against the closest, "
            f"{describe_launch(closest + 1, history[closest])}, this launch changes\n"
            + "\n".join(shown)
            + "\n  Point ids cover these settings: its records would sit beside the dir's as "
            "another experiment"
        ),
        fix=(
            "a new dir= for a new experiment; the dir's values to resume it (timeouts, ports and "
            "paths may change: pdbench/results/identity.py); or launch.allow_mixed=true to add this "
            "launch's Deployments and Points to the dir anyway"
        ),
    )


def with_launch(
    manifest: dict[str, Any],
    config: dict[str, Any],
    model_path: str,
    provenance: dict[str, Any],
    origin: LaunchOrigin,
    at: float,
) -> dict[str, Any]:
    """``manifest`` with this launch appended to its history; the dir's own name, config,
    model path and provenance (its first launch's) are kept."""
    history = launches(manifest)
    history.append(
        {
            "at": at,
            "name": config.get("name", ""),
            "command_line": origin.command_line,
            "invocation": origin.invocation,
            "config": config,
            "model_path": model_path,
            "provenance": provenance,
        }
    )
    first = history[0]
    return {
        **manifest,
        "name": first["name"] or config.get("name", ""),
        "created_at": manifest.get("created_at", at),
        "updated_at": at,
        "config": first["config"],
        "model_path": first["model_path"],
        "provenance": first["provenance"],
        "launches": history,
        "schema_version": MANIFEST_SCHEMA,
    }


def history_lines(manifest: Manifest) -> list[str]:
    """What ``status`` prints of the history: each launch, and what it changed against the
    dir's first launch."""
    history = manifest.history()
    lines = []
    for number, launch in enumerate(history, 1):
        lines.append(f"  {describe_launch(number, launch)}")
        if number > 1:
            changed = changes(history[0].config, launch.config)
            if changed:
                lines.append(f"    changed since launch 1: {'; '.join(changed)}")
    return lines


def with_nodes(
    provenance: dict[str, Any], reports: list[dict[str, Any]], deployment_id: str = ""
) -> dict[str, Any]:
    """``provenance`` plus ``nodes``: what each node's preflight found (``NodeReport.to_dict``:
    driver, CUDA, vLLM/NIXL/UCX versions, GPUs, NICs, address), keyed by SLURM node name
    (the host name off SLURM; node names stay apart where nodes share a host, as on the local
    test cluster). Nodes already there (other Deployments' jobs) stay; each lists the
    Deployments it checked for."""
    nodes = dict(provenance.get("nodes", {}))
    for report in reports:
        name = report.get("node_name") or report.get("hostname") or f"node{report.get('rank')}"
        checked = list(nodes.get(name, {}).get("deployments", []))
        if deployment_id and deployment_id not in checked:
            checked.append(deployment_id)
        nodes[name] = {
            "rank": report.get("rank"),
            "hostname": report.get("hostname"),
            "preflight_ok": report.get("ok"),
            **report.get("findings", {}),
            "deployments": checked,
        }
    return {**provenance, "nodes": nodes}
