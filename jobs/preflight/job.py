"""The preflight on the allocation: every job's first step, and a job of its own.

Each task of a Deployment's job runs ``node_preflight`` on its node before any server
starts: ``jobs.preflight``'s checks against the Deployment's launch spec, the cross-node
ones through ``<rendezvous>/preflight``. A task whose own checks failed stops at once; one
whose checks passed reads the other nodes' reports and stops when one of them failed. Either
way the Deployment's verdict is ONE line (node, check, found, fix): ``verdict``.

``run_node`` is the same step alone (``python -m pdbench preflight``: the entry
``jobs.entry.preflight.PreflightJob``): one task per node, no server, the reports returned
to the driver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connector.shared_files import write_json_atomic
from jobs.preflight.runner import run_preflight
from jobs.preflight.spec import spec_from_launch
from jobs.slurm_env import TaskEnvironment
from pdbench.results.manifest import with_nodes
from pdbench.results.preflight import (
    NodeReport,
    gather_reports,
    one_line,
    reports_dir,
    verdict,
)
from pdbench.results.store import RunStore
from pdbench.spec.launch import DeploymentSpec

PEER_REPORT_WAIT_S = 60.0  # after its own checks, how long a task waits for the others'
PEER_TIMEOUT_S = 120.0  # the cross-node checks' wait (NFS can hide a new file a minute)


class PreflightFailed(RuntimeError):
    """A node failed a preflight check; the message is the one line that says so."""


def node_preflight(
    spec: DeploymentSpec,
    rank: int,
    rendezvous: Path,
    peer_timeout_s: float = PEER_TIMEOUT_S,
    report_wait_s: float = PEER_REPORT_WAIT_S,
) -> dict[int, dict[str, Any]]:
    """This node's preflight, then (when it passed) the other nodes' reports, by rank.
    Raises ``PreflightFailed`` with the Deployment's one line when any node failed."""
    directory = reports_dir(rendezvous)
    directory.mkdir(parents=True, exist_ok=True)
    report = run_node(spec, rank, directory, peer_timeout_s)
    if not report.ok:  # this node's own line; the others' reports are not waited for
        raise PreflightFailed(one_line(report.failure_lines()))
    reports = gather_reports(directory, spec.nodes, report_wait_s)
    line = verdict(reports, spec.nodes, report_wait_s)
    if line:
        raise PreflightFailed(line)
    return reports


def run_node(
    spec: DeploymentSpec, rank: int, directory: Path, peer_timeout_s: float = PEER_TIMEOUT_S
) -> NodeReport:
    """This node's checks (report written to ``directory``), each echoed as a [pdbench] line."""
    report = run_preflight(spec_from_launch(spec), rank, directory, peer_timeout_s=peer_timeout_s)
    for line in report.lines():
        print(f"[pdbench] {line}", flush=True)
    return report


def findings_path(store: RunStore, deployment_id: str) -> Path:
    """Every node's preflight report of one Deployment's last job."""
    return store.root / "preflight" / f"{deployment_id}.json"


def record_findings(
    store: RunStore, deployment_id: str, reports: dict[int, dict[str, Any]], line: str
) -> None:
    """Keep the reports beside the records, and each node's findings (driver, CUDA, vLLM,
    NIXL, UCX versions, GPUs, NICs, address) in the manifest's provenance."""
    ordered = [reports[r] for r in sorted(reports)]
    write_json_atomic(
        findings_path(store, deployment_id),
        {"deployment_id": deployment_id, "ok": not line, "line": line, "reports": ordered},
    )

    def add_nodes(manifest: dict[str, Any]) -> None:
        manifest["provenance"] = with_nodes(manifest.get("provenance", {}), ordered, deployment_id)

    store.update_manifest(add_nodes)


def run_alone(spec: DeploymentSpec, rendezvous: Path) -> dict[str, Any]:
    """``python -m pdbench preflight`` on one task: this node's report (as JSON)."""
    rank = TaskEnvironment.from_environ().global_rank
    directory = reports_dir(rendezvous)
    directory.mkdir(parents=True, exist_ok=True)
    return run_node(spec, rank, directory).to_dict()
