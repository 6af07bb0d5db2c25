"""The preflight's entry: ``python -m pdbench preflight`` submits one task per node that checks
what the plan assumes, starting no server (``jobs.preflight``: the same checks every
deployment job runs first). The driver reads the reports back with
``pdbench.results.preflight``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdbench.spec.launch import DeploymentSpec


@dataclass
class PreflightJob:
    """A picklable submitit callable: one node's preflight of ``spec`` (no server started);
    every task returns its node's report."""

    spec: DeploymentSpec
    rendezvous: str  # fresh per call, in the run dir

    def __call__(self) -> dict[str, Any]:
        from jobs.preflight import job  # lazy: node runtime, loaded on the allocation only

        return job.run_alone(self.spec, Path(self.rendezvous))
