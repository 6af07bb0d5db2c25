"""What a node's preflight reports, and reading the reports back (pure, but for the files).

A node's preflight (``jobs.preflight``) is a list of ``CheckResult`` (one check: found, fix)
and the facts it found on the way (its provenance): a ``NodeReport``, written as
``report-<rank>.json`` beside the job's rendezvous. The job's tasks and the driver (``python
-m pdbench preflight``) read them back the same way; ``verdict`` says in ONE line (node,
check, found, fix) whether every node passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connector.shared_files import Rendezvous


@dataclass
class CheckResult:
    check: str  # imports | server | gpus | nvlink | ucx | model | address | ports | run_dir |
    # reach | transfer | transfer back
    ok: bool
    found: str
    fix: str = ""
    skipped: bool = False  # nothing to check here (a CPU plan, one node...)

    def line(self, node: str) -> str:
        """``preflight <node> <check>: found <found>. Fix: <fix>`` (one line)."""
        text = f"preflight {node} {self.check}: found {self.found}"
        if not self.ok and self.fix:
            text += f". Fix: {self.fix}"
        return " ".join(text.split())

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def passed(check: str, found: str) -> CheckResult:
    return CheckResult(check, True, found)


def skipped(check: str, why: str) -> CheckResult:
    return CheckResult(check, True, why, skipped=True)


def failed(check: str, found: str, fix: str) -> CheckResult:
    return CheckResult(check, False, found, fix)


@dataclass
class NodeReport:
    """One node's preflight: the checks and the facts found on the way (for provenance)."""

    rank: int
    node_name: str
    hostname: str
    results: list[CheckResult] = field(default_factory=list)
    findings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def label(self) -> str:
        return f"node{self.rank} ({self.node_name})"

    def failure_lines(self) -> list[str]:
        """One line per failed check: node, check, found, fix."""
        return [r.line(self.label) for r in self.results if not r.ok]

    def lines(self) -> list[str]:
        return [
            ("FAIL " if not r.ok else "skip " if r.skipped else "ok   ") + r.line(self.label)
            for r in self.results
        ]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeReport:
        """A report read back from its JSON (``to_dict``)."""
        results = [
            CheckResult(r["check"], r["ok"], r["found"], r.get("fix", ""), r.get("skipped", False))
            for r in data.get("results", [])
        ]
        return cls(
            rank=int(data["rank"]),
            node_name=data.get("node_name", ""),
            hostname=data.get("hostname", ""),
            results=results,
            findings=dict(data.get("findings", {})),
            seconds=float(data.get("seconds", 0.0)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node_name": self.node_name,
            "hostname": self.hostname,
            "ok": self.ok,
            "results": [r.to_dict() for r in self.results],
            "findings": self.findings,
            "seconds": round(self.seconds, 1),
        }


def report_file(rank: int) -> str:
    """Where rank ``rank`` leaves its ``NodeReport`` (``jobs.preflight.runner``)."""
    return f"report-{rank}.json"


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
