"""Plan, then commit: build every job, print it on a dry run, else submit and follow it.

One submitit job per Deployment, spanning the plan's nodes (one task per node). The local
executor runs jobs one after another (they share this machine's cores and ports); SLURM
gets them all at once as an array, capped by ``cluster.array_parallelism``.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from connector.bench_plan import pending_cases
from connector.bench_record import format_table
from jobs import transfer_bench
from jobs.entry.deployment import DeploymentJob
from pdbench.config.problems import ConfigError, ConfigProblem
from pdbench.config.schema import ExecutorKind, RunConfig
from pdbench.driver import provenance, tiny_model
from pdbench.driver.executors import make_executor
from pdbench.driver.progress import follow, follow_all
from pdbench.plan.deployments import Deployment, Plan, make_plan, to_jsonable
from pdbench.results.manifest import LaunchOrigin, mixed_launch_problem, with_launch
from pdbench.results.store import PointStatus, RunStore
from pdbench.spec.launch import LaunchSpec, build_launch, describe
from pdbench.spec.vllm_install import cluster_servers_vllm
from pdbench.validate.environment import check_environment, dry_run_note
from pdbench.validate.rules import check


def model_path_for(cfg: RunConfig, create: bool) -> str:
    """The served model's directory; the tiny model is generated (once) when ``create``."""
    if create or not cfg.model.generate:
        return tiny_model.resolve_model_path(cfg.model, cfg.cache_dir)
    return str(tiny_model.tiny_model_dir(cfg.model, cfg.cache_dir))


def point_states(plan: Plan, store: RunStore) -> dict[str, PointStatus]:
    """Every planned Point's status in the dir (each record read once)."""
    return {p.point_id: store.point_status(p.point_id) for p in plan.all_points()}


def pending_deployments(
    plan: Plan, store: RunStore, states: dict[str, PointStatus] | None = None
) -> list[str]:
    """Ids of the Deployments with a Point not yet recorded ``ok`` (what a launch submits)."""
    states = states if states is not None else point_states(plan, store)
    return [
        d.deployment_id
        for d in plan.deployments
        if any(states[p.point_id] is not PointStatus.ok for p in plan.points[d.deployment_id])
    ]


def read_previous_manifest(store: RunStore, say: bool = True) -> dict[str, Any]:
    """The dir's manifest, ``{}`` for a new dir or one that does not parse (named when
    ``say``: a launch sets it aside in ``write_manifest``, a dry run writes nothing)."""
    manifest, note = store.previous_manifest(set_aside=False)
    if note and say:
        print(f"[pdbench] {note}", flush=True)
    return manifest


def check_same_experiment(cfg: RunConfig, store: RunStore, origin: LaunchOrigin) -> None:
    """Refuse (``ConfigError``) a launch that measures something else than the dir holds,
    unless ``launch.allow_mixed`` (pdbench.results.manifest)."""
    manifest = read_previous_manifest(store, say=cfg.launch.dry_run)
    if cfg.launch.allow_mixed:
        return
    problem = mixed_launch_problem(manifest, to_jsonable(cfg), origin, str(store.root))
    if problem is not None:
        raise ConfigError([problem])


def resume_lines(
    plan: Plan, store: RunStore, verbose: bool, states: dict[str, PointStatus] | None = None
) -> list[str]:
    """What a launch into ``store``'s dir skips (Points recorded ``ok``) and runs (pending,
    failed or corrupt records), nothing when the dir holds no record of this plan yet.
    ``verbose``: one line per Point (the dry run); else one line per kind."""
    states = states if states is not None else point_states(plan, store)
    if all(state is PointStatus.pending for state in states.values()):
        return []
    ids = [p.point_id for p in plan.all_points()]
    skip = [pid for pid in ids if states[pid] is PointStatus.ok]
    run = [(pid, states[pid]) for pid in ids if states[pid] is not PointStatus.ok]
    head = f"{store.root} holds records: {len(skip)} Point(s) recorded ok are skipped, "
    head += f"{len(run)} run"
    if verbose:
        return [
            f"{head}:",
            *(f"  skip {pid} (ok)" for pid in skip),
            *(f"  run  {pid} ({state.value})" for pid, state in run),
        ]
    lines = [head]
    if skip:
        lines.append(f"skipping {len(skip)} Point(s) recorded ok: {', '.join(skip)}")
    redo = [f"{pid} ({state.value})" for pid, state in run if state is not PointStatus.pending]
    if redo:
        lines.append(f"measuring again {len(redo)} Point(s) not ok: {', '.join(redo)}")
    return lines


def claim_dir(store: RunStore) -> None:
    """Refuse (``ConfigError``) a launch into a dir another launch is following jobs in."""
    holder = store.claim()
    if holder is not None:
        raise ConfigError(
            [
                ConfigProblem(
                    "dir",
                    str(store.root),
                    f"is in use by another pdbench launch ({holder}): two launches into one "
                    "dir start servers on the same ports and write the same records",
                    "wait for it to end (python -m pdbench status dir=...), or give this "
                    "launch its own dir=",
                )
            ]
        )


def write_manifest(
    cfg: RunConfig,
    plan: Plan,
    store: RunStore,
    model_path: str,
    origin: LaunchOrigin | None = None,
) -> None:
    """Append this launch to the dir's manifest (its history) and merge its Deployments,
    under the manifest's lock (jobs add their nodes' preflight findings to it)."""
    driver = provenance.collect()

    def update(previous: dict[str, Any]) -> None:
        manifest = with_launch(
            previous,
            to_jsonable(cfg),
            model_path,
            driver,
            origin or LaunchOrigin.of([]),
            time.time(),
        )
        # the nodes' preflight findings (jobs of this run dir so far) stay
        nodes = previous.get("provenance", {}).get("nodes", {})
        manifest["provenance"] = {**manifest["provenance"], "nodes": nodes}
        manifest["deployments"] = merge_deployments(previous.get("deployments", []), plan)
        previous.clear()
        previous.update(manifest)

    note = store.update_manifest(update)
    if note:
        print(f"[pdbench] {note}", flush=True)


def merge_deployments(previous: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """Deployments already in the manifest (earlier jobs of a multirun sharing this run dir)
    stay; this plan's are added or replaced by id."""
    merged = {d["deployment_id"]: d for d in previous}
    for d in plan.deployments:
        points = merged.get(d.deployment_id, {}).get("points", [])
        points += [p.point_id for p in plan.points[d.deployment_id] if p.point_id not in points]
        merged[d.deployment_id] = {
            "deployment_id": d.deployment_id,
            "nodes": d.nodes,
            "instances": [to_jsonable(i) for i in d.instances],
            "points": points,
        }
    return list(merged.values())


def record_job(store: RunStore, deployment_id: str, job, executor: str) -> None:
    entry = {
        "deployment_id": deployment_id,
        "job_id": str(job.job_id),
        "executor": executor,  # local: the job id is the job's process id
        "submitted_at": time.time(),
        "stdout": str(job.paths.stdout),
        "stderr": str(job.paths.stderr),
    }
    store.update_manifest(lambda manifest: manifest.setdefault("jobs", []).append(entry))


def launch(
    cfg: RunConfig, origin: LaunchOrigin | None = None, follow_jobs: bool = True
) -> dict[str, Any]:
    """Validate, plan, and either print the launch (dry run) or run it to completion.

    ``origin``: the command line and invocation (``pdbench.cli`` passes it; the jobs of one
    ``-m`` sweep share it); a new one by default. On SLURM, ``follow_jobs=False`` (a sweep;
    ``launch.detach=true``) returns once the jobs are submitted:
    ``{"submitted": n, "jobs": [(deployment id, job), ...]}``."""
    check(cfg)
    origin = origin or LaunchOrigin.of([])
    plan = make_plan(cfg)
    store = RunStore(cfg.dir)
    check_same_experiment(cfg, store, origin)
    states = point_states(plan, store)
    pending = pending_deployments(plan, store, states)
    if cfg.launch.dry_run:
        model_path = model_path_for(cfg, create=False)
        spec = build_launch(cfg, plan, model_path, pending, cluster_servers_vllm(cfg.cluster))
        print(describe(spec, plan))
        print("\n".join(resume_lines(plan, store, verbose=True, states=states)))
        note = dry_run_note(cfg)
        if note:
            print(note)
        return {"dry_run": True, "deployments": len(plan.deployments)}
    check_environment(cfg)  # the nodes run this driver's interpreter and vLLM
    claim_dir(store)
    model_path = model_path_for(cfg, create=True)
    write_manifest(cfg, plan, store, model_path, origin)
    for line in resume_lines(plan, store, verbose=False, states=states):
        print(f"[pdbench] {line.strip()}", flush=True)
    if not pending:
        print(f"[pdbench] every point is already recorded ok in {store.root}")
        return {"submitted": 0}
    if cfg.cluster.executor is ExecutorKind.slurm:
        check_slurm_reachable()
    spec = build_launch(cfg, plan, model_path, pending, cluster_servers_vllm(cfg.cluster))
    if cfg.cluster.executor is ExecutorKind.slurm and not (follow_jobs and not cfg.launch.detach):
        jobs = submit_slurm(cfg, plan, store, spec)
        return {"submitted": len(jobs), "jobs": jobs}
    return submit_and_follow(cfg, plan, store, spec)


def deployment_job(cfg: RunConfig, plan: Plan, spec: LaunchSpec, dep_id: str) -> DeploymentJob:
    """The submitit callable of one Deployment: its Points and its launch spec."""
    return DeploymentJob(
        deployment=next(d for d in plan.deployments if d.deployment_id == dep_id),
        points=plan.points[dep_id],
        spec=spec.deployment(dep_id),
        tracking=cfg.tracking,
        run_config=to_jsonable(cfg),
    )


def submit_slurm(cfg: RunConfig, plan: Plan, store: RunStore, spec: LaunchSpec) -> list:
    """Submit ``spec``'s one SLURM submission (an array for several Deployments); returns
    ``[(deployment id, job), ...]`` without waiting for any."""
    (sub,) = spec.submissions
    executor = make_executor(cfg.cluster, Path(spec.submitit_folder), sub.nodes, sub.job_name)
    with executor.batch():
        jobs = [executor.submit(deployment_job(cfg, plan, spec, d)) for d in sub.deployment_ids]
    check_submitted_sbatch(jobs[0], sub.sbatch)
    for dep_id, job in zip(sub.deployment_ids, jobs, strict=True):
        record_job(store, dep_id, job, cfg.cluster.executor.value)
        print(f"[pdbench] submitted {dep_id} as job {job.job_id}", flush=True)
    return list(zip(sub.deployment_ids, jobs, strict=True))


def follow_submitted(
    cfg: RunConfig, plan: Plan, store: RunStore, submitted: list
) -> list[dict[str, Any]]:
    """Follow submitted jobs together to their end; with ``launch.on_failure=stop`` the
    first failed Deployment cancels the jobs still running."""

    deployments = {d.deployment_id: d for d in plan.deployments}

    def on_finished(i: int, outcome: dict[str, Any]) -> bool:
        return stop_after(cfg, plan, store, deployments[submitted[i][0]], outcome)

    jobs = [job for _, job in submitted]
    return follow_all(jobs, points_recorded(plan, store), on_finished=on_finished)


def submit_and_follow(cfg: RunConfig, plan: Plan, store: RunStore, spec: LaunchSpec):
    """Submit ``spec``'s submissions and follow their jobs to the end."""
    deployments = {d.deployment_id: d for d in plan.deployments}
    folder = Path(spec.submitit_folder)
    executor_name = cfg.cluster.executor.value
    if cfg.cluster.executor is not ExecutorKind.slurm:
        # Local jobs share this machine's cores and ports: one after another.
        results = []
        for i, sub in enumerate(spec.submissions):
            (dep_id,) = sub.deployment_ids
            executor = make_executor(cfg.cluster, folder, sub.nodes, sub.job_name)
            job = executor.submit(deployment_job(cfg, plan, spec, dep_id))
            record_job(store, dep_id, job, executor_name)
            print(f"[pdbench] submitted {dep_id} as job {job.job_id}", flush=True)
            results.append(follow(job, points_recorded(plan, store)))
            if stop_after(cfg, plan, store, deployments[dep_id], results[-1]):
                not_started = [d for s in spec.submissions[i + 1 :] for d in s.deployment_ids]
                if not_started:
                    print(f"[pdbench] launch.on_failure=stop: not starting {not_started}")
                break
        return {"submitted": len(results), "results": results}
    submitted = submit_slurm(cfg, plan, store, spec)
    results = follow_submitted(cfg, plan, store, submitted)
    return {"submitted": len(submitted), "results": results}


def check_submitted_sbatch(job, planned: str) -> None:
    """Say so loudly if the sbatch file submitit gave SLURM is not the one the spec holds
    (and the dry run printed): a submitit upgrade that changed it, for instance."""
    path = Path(job.paths.submission_file)
    try:
        submitted = path.read_text()
    except OSError:
        return
    if submitted != planned:
        print(
            f"[pdbench] WARNING: the sbatch file SLURM got ({path}) differs from the launch "
            "spec's (what launch.dry_run=true prints); check the submitit version",
            flush=True,
        )


def deployment_failed(plan: Plan, store: RunStore, dep: Deployment, result: dict) -> bool:
    """A Deployment failed when its job did, or when any of its Points is not ``ok``."""
    if "error" in result:
        return True
    return any(
        store.point_status(p.point_id) is not PointStatus.ok for p in plan.points[dep.deployment_id]
    )


def stop_after(cfg: RunConfig, plan: Plan, store: RunStore, dep: Deployment, result: dict) -> bool:
    """Whether ``launch.on_failure=stop`` ends the run after this Deployment."""
    return cfg.launch.on_failure == "stop" and deployment_failed(plan, store, dep, result)


def check_slurm_reachable() -> None:
    """Fail before submitting anything when no SLURM controller answers."""
    if shutil.which("sinfo") is None:
        raise SystemExit(
            "cluster.executor=slurm but there is no `sinfo` here. Fix: run on a SLURM login "
            "node, or start the local test cluster with `scripts/local-slurm.sh start`."
        )
    probe = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        raise SystemExit(
            f"cluster.executor=slurm but SLURM does not answer ({probe.stderr.strip()}). Fix: "
            "check SLURM_CONF / the controller, or `scripts/local-slurm.sh start` locally."
        )


def points_recorded(plan: Plan, store: RunStore):
    """A progress counter: Points with a record (ok or failed) of all planned."""
    ids = [p.point_id for p in plan.all_points()]
    return lambda: f"{sum(store.has_record(i) for i in ids)}/{len(ids)} points"


def run_transfer_bench(cfg: RunConfig) -> Path:
    """Validate, plan, submit, follow and tabulate the transfer bench (``command=
    transfer_bench``): the same checks as every launch. Returns the records' directory."""
    check(cfg)
    out = transfer_bench.records_dir(cfg.dir)
    spec = transfer_bench.bench_spec(cfg)
    total = len(spec.cases)
    if cfg.launch.resume:
        spec = pending_cases(spec, transfer_bench.recorded_ok(cfg.dir))
    print(transfer_bench.describe(spec), flush=True)
    if total > len(spec.cases):
        print(f"  ({total - len(spec.cases)} of {total} cases already recorded ok: skipped)")
    if cfg.launch.dry_run or not spec.cases:
        if not spec.cases:
            print(format_table(transfer_bench.load_records(cfg.dir)))
        return out
    if cfg.cluster.executor is ExecutorKind.debug:
        raise ValueError(
            "the transfer bench needs two tasks; cluster=debug runs one: "
            "use cluster=local or cluster=slurm"
        )
    if cfg.cluster.executor is ExecutorKind.slurm:
        check_slurm_reachable()
    folder = transfer_bench.submitit_folder(cfg.dir)
    executor = make_executor(cfg.cluster, folder, nodes=2, job_name=transfer_bench.JOB_NAME)
    job = executor.submit(transfer_bench.TransferBenchJob(spec, str(Path(cfg.dir).resolve())))
    print(
        f"[pdbench] submitted transfer bench job {job.job_id} ({len(spec.cases)} cases); "
        f"logs in {folder}",
        flush=True,
    )
    wanted = {c.record_id for c in spec.cases}

    def recorded() -> str:
        done = {r["record_id"] for r in transfer_bench.load_records(cfg.dir)}
        return f"{len(wanted & done)}/{len(wanted)}"

    outcome = follow(job, recorded)
    error = outcome.get("error", "")
    print(format_table(transfer_bench.load_records(cfg.dir)), flush=True)
    print(f"records: {out}")
    if error:
        raise RuntimeError(f"transfer bench job {job.job_id} failed: {error}\n  logs: {folder}")
    return out
