"""A run dir's ``manifest.json``, typed: the experiment the dir holds and every launch into it.

Written by the driver (``pdbench.results.manifest`` builds each launch's entry,
``pdbench.driver.run_dir`` and ``pdbench.driver.launch`` add the Deployments and the jobs
submitted, the preflight adds each node's findings) and read back into these types
(``records.read.manifest``) by ``status``, a relaunch and the analysis. ``config`` is the
composed run config as JSON (the config package's to read: a mapping here); ``traffic`` is
a replayed trace's record (``pdbench.traffic.replay``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from records.versions import MANIFEST_SCHEMA


@dataclass
class Provenance:
    """Where a launch ran: the driver's host and stack, and (after the preflight) each
    node's findings by node."""

    git_sha: str = ""
    hostname: str = ""
    python: str = ""
    platform: str = ""
    cpu: str = ""
    packages: dict[str, str] = field(default_factory=dict)
    ucx: str = ""
    ucx_system: str = ""
    gpus: list[Any] = field(default_factory=list)
    nodes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Launch:
    """One ``python -m pdbench`` launch into the dir (a resume, a requeue's driver, each
    job of a ``-m`` sweep)."""

    at: float = 0.0
    name: str = ""
    command_line: str = ""
    invocation: str = ""  # the id of the pdbench process (every job of one -m sweep's)
    config: dict[str, Any] = field(default_factory=dict)
    model_path: str = ""
    provenance: Provenance = field(default_factory=Provenance)


@dataclass
class DeploymentEntry:
    deployment_id: str = ""
    nodes: int = 0
    instances: list[Any] = field(default_factory=list)
    points: list[str] = field(default_factory=list)  # its Point ids, in run order


@dataclass
class JobEntry:
    """A job the driver submitted for a Deployment."""

    deployment_id: str = ""
    job_id: str = ""
    executor: str = ""  # local | slurm | debug
    invocation: str = ""
    submitted_at: float = 0.0
    stdout: str = ""
    stderr: str = ""


@dataclass
class Manifest:
    name: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    config: dict[str, Any] = field(default_factory=dict)  # the dir's first launch's
    model_path: str = ""
    provenance: Provenance = field(default_factory=Provenance)
    launches: list[Launch] = field(default_factory=list)
    deployments: list[DeploymentEntry] = field(default_factory=list)
    jobs: list[JobEntry] = field(default_factory=list)
    traffic: dict[str, Any] | None = None  # a replayed trace's record
    schema_version: int = MANIFEST_SCHEMA

    def history(self) -> list[Launch]:
        """The dir's launches, oldest first; a manifest written before the history kept
        one has its first launch's fields instead."""
        if self.launches:
            return self.launches
        if not self.config:
            return []
        return [
            Launch(
                at=self.created_at,
                name=self.name,
                config=self.config,
                model_path=self.model_path,
                provenance=self.provenance,
            )
        ]
