"""Plan, then commit: build every job of a run, print it on a dry run, else submit and follow.

One submitit job per Deployment, spanning the plan's nodes (one task per node). The local
executor runs jobs one after another (they share this machine's cores and ports); SLURM
gets them all at once as an array, capped by ``cluster.array_parallelism``. The config a
launch gets was composed and validated once, by the command line's pre-check
(``pdbench.cli``); a launch returns a ``Launched``: how it ended and its jobs' outcomes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from jobs.entry.deployment import DeploymentJob
from pdbench.config.problems import ConfigError
from pdbench.config.schema import ExecutorKind, RunConfig, WorkloadKind
from pdbench.driver.progress import JobOutcome
from pdbench.driver.report_table import print_run_table
from pdbench.driver.run_dir import RunDir
from pdbench.driver.slurm_partitions import partition_problem
from pdbench.driver.submit import Submitted, check_slurm_reachable, follow, submit
from pdbench.driver.tiny_model import model_path_for
from pdbench.plan.attempt import attempt_line, first_pass, job_points
from pdbench.plan.deployments import Plan, make_plan
from pdbench.results.manifest import LaunchOrigin
from pdbench.results.store import RunStore
from pdbench.spec.launch import LaunchSpec, build_launch, describe
from pdbench.spec.vllm_install import cluster_servers_vllm
from pdbench.validate.environment import dry_run_note
from pdbench.validate.trace import replay_of
from records.point import PointStatus


class Ended(Enum):
    """How a launch ended."""

    dry_run = "dry_run"  # printed what would run, submitted nothing
    nothing_pending = "nothing_pending"  # every Point already recorded ok
    submitted = "submitted"  # submitted, not followed (a sweep's SLURM run; launch.detach)
    followed = "followed"  # submitted and followed to the end of every job


@dataclass
class Launched:
    """What a launch did."""

    ended: Ended
    run_dir: RunDir
    jobs: list[Submitted] = field(default_factory=list)
    outcomes: list[JobOutcome] = field(default_factory=list)  # once followed

    @property
    def ok(self) -> bool:
        """Every job ended without an error and every Point of the dir is recorded ok."""
        return not any(o.failed for o in self.outcomes) and self.run_dir.all_ok()


def launch(
    cfg: RunConfig,
    origin: LaunchOrigin,
    follow_jobs: bool = True,
    plan: Plan | None = None,
    also: list[RunConfig] | None = None,
) -> Launched:
    """Plan ``cfg`` (or take a sweep's ``plan``, ``pdbench.plan.sweep``) and either print
    the launch (dry run) or submit it and, unless SLURM is not to be followed
    (``follow_jobs=False``: a sweep; ``launch.detach=true``), follow its jobs to the end.
    ``also``: the sweep's other compositions measured on this launch's servers (the run
    dir's manifest keeps their configs)."""
    partition = partition_problem(cfg)  # SLURM asked, before anything is written
    if partition is not None:
        raise ConfigError([partition])
    plan = plan if plan is not None else make_plan(cfg)
    run_dir = RunDir.open(cfg, plan, origin, claim=not cfg.launch.dry_run, also=also or [])
    model_path = model_path_for(cfg, create=not cfg.launch.dry_run)
    spec = build_launch(cfg, plan, model_path, run_dir.pending, cluster_servers_vllm(cfg.cluster))
    replay = replay_of(cfg) if cfg.workload.kind is WorkloadKind.trace else None
    if replay is not None:  # what the trace is, as recorded and as it will be replayed
        prefix = "" if cfg.launch.dry_run else "[pdbench] "
        print("\n".join(prefix + line for line in replay.describe()) + "\n", flush=True)
    if cfg.launch.dry_run:
        held = run_dir.resume_lines(verbose=True)
        if held:  # what the dir holds first: the plan below can run to hundreds of lines
            print(f"{held[0].rstrip(':')} (each listed at the end)\n")
        print(describe(spec, plan))
        if cfg.cluster.executor is ExecutorKind.slurm and spec.submissions:
            try:
                records = run_dir.store.iter_points()
            except (OSError, ValueError):  # a corrupt record: the estimate instead
                records = []
            print(attempt_line(cfg, plan, records) + "\n")
        for search in plan.searches.values():  # each search's first pass, where estimated
            line = first_pass(cfg, search).describe(cfg.search.budget_min)
            if line:
                print(line + "\n")
        print("\n".join(held))
        note = dry_run_note(cfg)
        if note:
            print(note)
        return Launched(Ended.dry_run, run_dir)
    run_dir.begin(model_path, origin, replay.record() if replay is not None else None)
    if not spec.submissions:
        print(f"[pdbench] every point is already recorded ok in {run_dir.store.root}")
        return Launched(Ended.nothing_pending, run_dir)
    if cfg.cluster.executor is not ExecutorKind.slurm:
        return run_locally(cfg, plan, spec, run_dir)
    check_slurm_reachable()
    jobs = submit_deployments(cfg, plan, spec, run_dir, 0)
    if not follow_jobs or cfg.launch.detach:
        return Launched(Ended.submitted, run_dir, jobs)
    return Launched(Ended.followed, run_dir, jobs, follow(jobs, run_dir.recorded))


def submit_deployments(
    cfg: RunConfig, plan: Plan, spec: LaunchSpec, run_dir: RunDir, index: int
) -> list[Submitted]:
    """Submit ``spec``'s submission ``index`` (on SLURM an array of every pending
    Deployment), each job recorded in the manifest and stopping the run when it fails
    under ``launch.on_failure=stop``."""
    sub = spec.submissions[index]
    work = [
        (
            dep_id,
            DeploymentJob(
                deployment=next(d for d in plan.deployments if d.deployment_id == dep_id),
                points=plan.points[dep_id],
                spec=spec.deployment(dep_id),
                tracking=cfg.tracking,
                run_config=run_dir.config,
                search=plan.searches.get(dep_id),
            ),
        )
        for dep_id in sub.deployment_ids
    ]
    folder = Path(spec.submitit_folder)
    points = max(job_points(plan, dep_id) for dep_id in sub.deployment_ids)
    jobs = submit(cfg.cluster, folder, sub.nodes, sub.job_name, work, sub.sbatch, points)
    for job in jobs:
        run_dir.record_job(job.label, job.job)
        job.stop_after = lambda outcome, dep_id=job.label: run_dir.stop_after(dep_id, outcome)
    return jobs


def run_locally(cfg: RunConfig, plan: Plan, spec: LaunchSpec, run_dir: RunDir) -> Launched:
    """Local jobs share this machine's cores and ports: one after another, each followed to
    its end; ``launch.on_failure=stop`` starts none after a failed one."""
    jobs: list[Submitted] = []
    outcomes: list[JobOutcome] = []
    for i in range(len(spec.submissions)):
        (job,) = submit_deployments(cfg, plan, spec, run_dir, i)
        jobs.append(job)
        outcomes += follow([job], run_dir.recorded)
        if job.stop_after is not None and job.stop_after(outcomes[-1]):
            not_started = [d for s in spec.submissions[i + 1 :] for d in s.deployment_ids]
            if not_started:
                print(f"[pdbench] launch.on_failure=stop: not starting {not_started}")
            break
    return Launched(Ended.followed, run_dir, jobs, outcomes)


def finish_sweep(launches: list[Launched]) -> bool:
    """The SLURM runs of a ``-m`` sweep, submitted one after another: follow every job at
    once (unless all are detached), then print each run dir's table; True when all went ok."""
    jobs = [job for launched in launches for job in launched.jobs]
    if not jobs:
        return True
    print(
        f"[pdbench] sweep: {len(jobs)} job(s) of {len(launches)} composition(s) submitted",
        flush=True,
    )
    run_dirs = list(dict.fromkeys(launched.run_dir.store.root for launched in launches))
    if all(launched.run_dir.cfg.launch.detach for launched in launches):
        for root in run_dirs:
            print(f"[pdbench] follow them with: python -m pdbench status dir={root}")
        return True

    def recorded() -> str:
        counts = [launched.run_dir.counts() for launched in launches]
        return f"{sum(done for done, _ in counts)}/{sum(n for _, n in counts)} points"

    outcomes = follow(jobs, recorded)
    ok = not any(o.failed for o in outcomes)
    for root in run_dirs:
        store = RunStore(root)
        print_run_table(store.iter_points(), str(root))
        ok = ok and all(p.status == PointStatus.ok for p in store.iter_points())
    return ok
