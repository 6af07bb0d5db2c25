"""The preflight on the allocation: every job's first step, and a job of its own.

Each task of a Deployment's job runs ``node_preflight`` on its node before any server
starts: ``jobs.preflight``'s checks against the Deployment's launch spec, the cross-node
ones through ``<rendezvous>/preflight``. A task whose own checks failed stops at once; one
whose checks passed reads the other nodes' reports and stops when one of them failed. Either
way the Deployment's verdict is ONE line (node, check, found, fix): ``verdict``.

``PreflightJob`` is the same step alone (``python -m pdbench preflight``): one task per
node, no server, the reports returned to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector.shared_files import Rendezvous, write_json_atomic
from jobs.preflight import NodeReport, run_preflight
from jobs.preflight.rendezvous import report_file
from jobs.preflight.spec import spec_from_launch
from jobs.slurm_env import TaskEnvironment
from pdbench.driver import provenance
from pdbench.results.store import RunStore
from pdbench.spec.launch import DeploymentSpec

PEER_REPORT_WAIT_S = 60.0  # after its own checks, how long a task waits for the others'
PEER_TIMEOUT_S = 120.0  # the cross-node checks' wait (NFS can hide a new file a minute)


class PreflightFailed(RuntimeError):
    """A node failed a preflight check; the message is the one line that says so."""


def reports_dir(rendezvous: Path) -> Path:
    """Where one job attempt's nodes put their preflight files (rendezvous, reports)."""
    return Path(rendezvous) / "preflight"


def read_reports(directory: Path, nodes: int) -> dict[int, dict[str, Any]]:
    """The reports written so far, by rank."""
    return gather_reports(directory, nodes, 0.0)


def gather_reports(directory: Path, nodes: int, timeout_s: float) -> dict[int, dict[str, Any]]:
    """Every node's report, or those there after ``timeout_s``."""
    names = {report_file(rank): rank for rank in range(nodes)}
    found, _ = Rendezvous(directory).gather(names, timeout_s)
    return {names[name]: report for name, report in found.items()}


def one_line(lines: list[str]) -> str:
    """The first failure line and how many more there are ("" when none)."""
    if not lines:
        return ""
    more = f" (+{len(lines) - 1} more failed check(s))" if len(lines) > 1 else ""
    return lines[0] + more


def verdict(reports: dict[int, dict[str, Any]], nodes: int, timeout_s: float) -> str:
    """ "" when every node passed; else the first failed check, lowest rank first, as ONE
    line, with how many more failed. A node without a report failed too."""
    lines: list[str] = []
    for rank in range(nodes):
        report = reports.get(rank)
        if report is None:
            lines.append(
                f"preflight node{rank} report: found no preflight report from node{rank} after "
                f"{timeout_s:.0f} s (its task did not start, or failed before writing it). "
                f"Fix: read node{rank}'s task log (submitit folder of the run dir)"
            )
            continue
        lines += NodeReport.from_dict(report).failure_lines()
    return one_line(lines)


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
        manifest["provenance"] = provenance.with_nodes(
            manifest.get("provenance", {}), ordered, deployment_id
        )

    store.update_manifest(add_nodes)


@dataclass
class PreflightJob:
    """A picklable submitit callable: one node's preflight of ``spec`` (no server started);
    every task returns its node's report."""

    spec: DeploymentSpec
    rendezvous: str  # fresh per call, in the run dir

    def __call__(self) -> dict[str, Any]:
        rank = TaskEnvironment.from_environ().global_rank
        directory = reports_dir(Path(self.rendezvous))
        directory.mkdir(parents=True, exist_ok=True)
        return run_node(self.spec, rank, directory).to_dict()
