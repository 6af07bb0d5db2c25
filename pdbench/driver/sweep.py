"""A Hydra ``-m`` sweep on SLURM: every composition's jobs are submitted first, then followed
together, so that the scheduler can run them side by side.

Hydra's basic launcher runs a sweep's compositions one after another in this process. For
each SLURM ``run``, ``pdbench.cli`` calls ``launch(cfg, follow_jobs=False)`` (submit, do not
wait) and hands the jobs to ``Sweep.add``; once Hydra is through, ``Sweep.finish`` follows
every job at once, prints each run dir's table and says whether anything failed. With
``launch.detach=true`` it returns at once and ``python -m pdbench status dir=...`` follows.
Local-executor sweeps stay sequential (their jobs share this machine's cores and ports).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdbench.config.schema import Command, ExecutorKind, RunConfig
from pdbench.driver.launch import stop_after
from pdbench.driver.progress import follow_all
from pdbench.driver.report_table import print_run_table
from pdbench.plan.deployments import Plan, make_plan
from pdbench.results.store import PointStatus, RunStore


@dataclass
class Submitted:
    """One composition's submitted jobs."""

    cfg: RunConfig
    plan: Plan
    jobs: list[tuple[str, Any]]  # (deployment id, submitit job)


@dataclass
class Sweep:
    submitted: list[Submitted] = field(default_factory=list)

    @staticmethod
    def takes(cfg: RunConfig) -> bool:
        """Whether this composition is submitted now and followed at the sweep's end."""
        return (
            cfg.command is Command.run
            and cfg.cluster.executor is ExecutorKind.slurm
            and not cfg.launch.dry_run
        )

    def add(self, cfg: RunConfig, outcome: dict[str, Any]) -> None:
        if outcome.get("jobs"):
            self.submitted.append(Submitted(cfg, make_plan(cfg), list(outcome["jobs"])))

    @property
    def run_dirs(self) -> list[str]:
        return list(dict.fromkeys(s.cfg.dir for s in self.submitted))

    def finish(self) -> bool:
        """Follow every submitted job together (unless detached); True when all went ok."""
        if not self.submitted:
            return True
        jobs = [(s, dep_id, job) for s in self.submitted for dep_id, job in s.jobs]
        print(
            f"[pdbench] sweep: {len(jobs)} job(s) of {len(self.submitted)} composition(s) "
            "submitted",
            flush=True,
        )
        if all(s.cfg.launch.detach for s in self.submitted):
            for run_dir in self.run_dirs:
                print(f"[pdbench] follow them with: python -m pdbench status dir={run_dir}")
            return True
        points = [
            (RunStore(s.cfg.dir), p.point_id) for s in self.submitted for p in s.plan.all_points()
        ]

        def recorded() -> str:
            done = sum(store.has_record(pid) for store, pid in points)
            return f"{done}/{len(points)} points"

        def on_finished(i: int, outcome: dict[str, Any]) -> bool:
            s, dep_id, _ = jobs[i]
            dep = next(d for d in s.plan.deployments if d.deployment_id == dep_id)
            return stop_after(s.cfg, s.plan, RunStore(s.cfg.dir), dep, outcome)

        outcomes = follow_all([job for _, _, job in jobs], recorded, on_finished=on_finished)
        ok = not any("error" in o for o in outcomes)
        for run_dir in self.run_dirs:
            store = RunStore(run_dir)
            print_run_table(store.iter_points(), run_dir)
            ok = ok and all(p.get("status") == PointStatus.ok for p in store.iter_points())
        return ok
