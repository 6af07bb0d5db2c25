"""Plan, then commit: build every job, print it on a dry run, else submit and follow it.

One submitit job per Deployment, spanning the plan's nodes (one task per node). The local
executor runs jobs one after another (they share this machine's cores and ports); SLURM
gets them all at once as an array, capped by ``cluster.array_parallelism``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from pdbench.config import ExecutorKind, RunConfig
from pdbench.plan import Deployment, Plan, make_plan, to_jsonable
from pdbench.results import RunStore


def job_settings(cfg: RunConfig, model_path: str):
    from jobs.deployment import JobSettings

    return JobSettings(
        model_path=model_path,
        python=cfg.cluster.python or sys.executable,
        local=cfg.cluster.executor is not ExecutorKind.slurm,
        tracking=cfg.tracking,
        run_config=to_jsonable(cfg),
    )


def job_name(dep) -> str:
    """The SLURM job name of a deployment (the dry run prints what is submitted)."""
    return f"pdbench-{dep.deployment_id}"


def model_path_for(cfg: RunConfig, create: bool) -> str:
    """The served model's directory; the tiny model is generated (once) when ``create``."""
    if not cfg.model.generate:
        return cfg.model.path
    from pdbench import tiny_model

    if create:
        return str(tiny_model.ensure_tiny_model(cfg.model, cfg.cache_dir))
    return str(tiny_model.tiny_model_dir(cfg.model, cfg.cache_dir))


def describe_plan(cfg: RunConfig, plan: Plan, model_path: str) -> str:
    """Human-readable dry run: deployments, per-node commands and env, points, sbatch text."""
    import shlex

    from pdbench.serve_command import serve_command, serve_env

    lines = [f"run dir: {cfg.dir}", f"executor: {cfg.cluster.executor.value}", ""]
    python = cfg.cluster.python or sys.executable
    for dep in plan.deployments:
        lines.append(f"deployment {dep.deployment_id}: {dep.nodes} node(s)")
        for node in range(dep.nodes):
            host = (
                "127.0.0.1" if cfg.cluster.executor is not ExecutorKind.slurm else f"<node{node}>"
            )
            lines.append(f"  node {node}:")
            for inst in dep.instances_on(node):
                env = serve_env(dep, inst, host, f"{cfg.dir}/kvparams", f"{cfg.dir}/traces")
                cmd = serve_command(dep, inst, model_path, host, python)
                lines.append(
                    f"    {inst.name} ({inst.role}, tp={inst.tp}, gpus={list(inst.gpus)}):"
                )
                lines.append(
                    "      env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                )
                lines.append("      " + shlex.join(cmd))
        for point in plan.points[dep.deployment_id]:
            lines.append(
                f"  point {point.point_id}: flow={point.flow.value} history={point.history_tokens}"
            )
        if cfg.cluster.executor is ExecutorKind.slurm:
            from pdbench.sbatch import sbatch_script

            lines.append("  sbatch script:")
            text = sbatch_script(cfg.cluster, dep.nodes, job_name(dep), Path(cfg.dir) / "submitit")
            lines += ["    " + line for line in text.splitlines()]
        lines.append("")
    return "\n".join(lines)


def write_manifest(cfg: RunConfig, plan: Plan, store: RunStore, model_path: str) -> None:
    from pdbench import provenance

    path = store.root / "manifest.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    manifest = {
        "name": cfg.name,
        "created_at": previous.get("created_at", time.time()),
        "updated_at": time.time(),
        "config": to_jsonable(cfg),
        "model_path": model_path,
        "provenance": provenance.collect(),
        "deployments": merge_deployments(previous.get("deployments", []), plan),
        "jobs": previous.get("jobs", []),
    }
    store.write_manifest(manifest)


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
    manifest = store.read_manifest()
    manifest.setdefault("jobs", []).append(
        {
            "deployment_id": deployment_id,
            "job_id": str(job.job_id),
            "executor": executor,  # local: the job id is the job's process id
            "submitted_at": time.time(),
            "stdout": str(job.paths.stdout),
            "stderr": str(job.paths.stderr),
        }
    )
    store.write_manifest(manifest)


def launch(cfg: RunConfig) -> dict[str, Any]:
    """Validate, plan, and either print the plan (dry run) or run it to completion."""
    from pdbench.validate import check

    check(cfg)
    plan = make_plan(cfg)
    if cfg.launch.dry_run:
        print(describe_plan(cfg, plan, model_path_for(cfg, create=False)))
        return {"dry_run": True, "deployments": len(plan.deployments)}
    model_path = model_path_for(cfg, create=True)
    store = RunStore(cfg.dir)
    write_manifest(cfg, plan, store, model_path)
    return submit_and_follow(cfg, plan, store, model_path)


def submit_and_follow(cfg: RunConfig, plan: Plan, store: RunStore, model_path: str):
    from jobs.deployment import DeploymentJob
    from pdbench.executors import make_executor
    from pdbench.progress import follow

    settings = job_settings(cfg, model_path)
    pending = [
        d
        for d in plan.deployments
        if any(store.point_status(p.point_id) != "ok" for p in plan.points[d.deployment_id])
    ]
    if not pending:
        print(f"[pdbench] every point is already recorded ok in {store.root}")
        return {"submitted": 0}
    folder = store.root / "submitit"
    job_fns = [
        DeploymentJob(str(store.root), d, plan.points[d.deployment_id], settings) for d in pending
    ]
    if cfg.cluster.executor is not ExecutorKind.slurm:
        # Local jobs share this machine's cores and ports: one after another.
        results = []
        for i, (dep, job_fn) in enumerate(zip(pending, job_fns, strict=True)):
            executor = make_executor(cfg.cluster, folder, dep.nodes, job_name(dep))
            job = executor.submit(job_fn)
            record_job(store, dep.deployment_id, job, cfg.cluster.executor.value)
            print(f"[pdbench] submitted {dep.deployment_id} as job {job.job_id}", flush=True)
            results.append(follow(job, points_recorded(plan, store)))
            if stop_after(cfg, plan, store, dep, results[-1]):
                not_started = [d.deployment_id for d in pending[i + 1 :]]
                if not_started:
                    print(f"[pdbench] launch.on_failure=stop: not starting {not_started}")
                break
        return {"submitted": len(results), "results": results}
    check_slurm_reachable()
    # SLURM: every deployment of the plan spans the same nodes, so they go out as one job
    # array, at most cluster.array_parallelism running at once.
    name = job_name(pending[0]) if len(pending) == 1 else f"pdbench-{cfg.name}"
    executor = make_executor(cfg.cluster, folder, pending[0].nodes, name)
    with executor.batch():
        jobs = [executor.submit(job_fn) for job_fn in job_fns]
    for dep, job in zip(pending, jobs, strict=True):
        record_job(store, dep.deployment_id, job, cfg.cluster.executor.value)
        print(f"[pdbench] submitted {dep.deployment_id} as job {job.job_id}", flush=True)
    results = []
    for i, (dep, job) in enumerate(zip(pending, jobs, strict=True)):
        results.append(follow(job, points_recorded(plan, store)))
        if stop_after(cfg, plan, store, dep, results[-1]):
            for other in jobs[i + 1 :]:
                if not other.done():
                    other.cancel(check=False)
                    print(f"[pdbench] launch.on_failure=stop: cancelled job {other.job_id}")
            break
    return {"submitted": len(pending), "results": results}


def deployment_failed(plan: Plan, store: RunStore, dep: Deployment, result: dict) -> bool:
    """A Deployment failed when its job did, or when any of its Points is not ``ok``."""
    if "error" in result:
        return True
    return any(store.point_status(p.point_id) != "ok" for p in plan.points[dep.deployment_id])


def stop_after(cfg: RunConfig, plan: Plan, store: RunStore, dep: Deployment, result: dict) -> bool:
    """Whether ``launch.on_failure=stop`` ends the run after this Deployment."""
    return cfg.launch.on_failure == "stop" and deployment_failed(plan, store, dep, result)


def check_slurm_reachable() -> None:
    """Fail before submitting anything when no SLURM controller answers."""
    import shutil
    import subprocess

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
    return lambda: f"{sum(store.point_status(i) != 'pending' for i in ids)}/{len(ids)} points"


def run_dir_of(cfg: RunConfig) -> Path:
    return Path(cfg.dir)
