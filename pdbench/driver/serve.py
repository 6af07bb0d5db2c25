"""``python -m pdbench serve``: start one deployment for any client and keep it up.

The same plan, launch spec and job as a run (``pdbench.driver.launch``), with the spec's
``serve_flow`` set: the job warms up, then serves that flow (the first of ``flow.flows``)
until it is stopped, measuring no Point (``jobs.run.serve``). This process follows the job
and echoes its lines, the router's URL and the model among them; Ctrl-C cancels the job
(its servers stop). On SLURM the job also ends at its time limit (no requeue).
``python -m pdbench status dir=...`` shows the serving deployment and its URL.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import psutil

from connector.process_env import RUN_DIR_ENV
from jobs.entry.deployment import DeploymentJob
from pdbench.config.problems import ConfigError, ConfigProblem
from pdbench.config.schema import ExecutorKind, RunConfig
from pdbench.driver.run_dir import RunDir, write_manifest
from pdbench.driver.submit import check_slurm_reachable, follow, submit
from pdbench.driver.tiny_model import model_path_for
from pdbench.plan.deployments import Plan, make_plan
from pdbench.results.manifest import LaunchOrigin
from pdbench.spec.launch import LaunchSpec, build_launch, describe
from pdbench.spec.vllm_install import cluster_servers_vllm

STOP_WAIT_S = 120.0  # how long Ctrl-C waits for the job to stop its servers
LOCAL_GRACE_S = 60.0  # a local job stopping by itself before it is cancelled


def serving_spec(spec: LaunchSpec, flow: str) -> LaunchSpec:
    """``spec`` with every deployment set to serve ``flow`` (pure)."""
    return replace(spec, deployments=[replace(d, serve_flow=flow) for d in spec.deployments])


def serve_problem(plan: Plan) -> ConfigProblem | None:
    """Why ``plan`` cannot be served (it plans several deployments), None when it can."""
    if len(plan.deployments) == 1:
        return None
    ids = ", ".join(d.deployment_id for d in plan.deployments)
    return ConfigProblem(
        "command",
        "serve",
        f"serves one deployment; this config plans {len(plan.deployments)} ({ids})",
        "one value for each deployment axis (flow.kv_recompute_thresholds, "
        "flow.decoder_kv_blocks_ttls_s: [])",
    )


def serve(cfg: RunConfig, origin: LaunchOrigin) -> None:
    """Plan one deployment, print its launch (dry run) or start it and follow it until it
    stops."""
    plan = make_plan(cfg)
    problem = serve_problem(plan)
    if problem is not None:
        raise ConfigError([problem])
    flow = cfg.flow.flows[0].value
    run_dir = RunDir.open(cfg, plan, origin, claim=not cfg.launch.dry_run)
    model_path = model_path_for(cfg, create=not cfg.launch.dry_run)
    spec = build_launch(cfg, plan, model_path, None, cluster_servers_vllm(cfg.cluster))
    spec = serving_spec(spec, flow)
    if cfg.launch.dry_run:
        print(describe(spec, plan))
        return
    write_manifest(run_dir.config, plan, run_dir.store, model_path, origin)
    if cfg.cluster.executor is ExecutorKind.slurm:
        check_slurm_reachable()
    (sub,) = spec.submissions
    (dep_id,) = sub.deployment_ids
    job = DeploymentJob(
        deployment=plan.deployments[0],
        points=plan.points[dep_id],
        spec=spec.deployment(dep_id),
        tracking=cfg.tracking,
        run_config=run_dir.config,
    )
    folder = Path(spec.submitit_folder)
    (submitted,) = submit(cfg.cluster, folder, sub.nodes, sub.job_name, [(dep_id, job)], sub.sbatch)
    run_dir.record_job(dep_id, submitted.job)
    print(f"[pdbench] serving {dep_id} (Ctrl-C stops it)", flush=True)
    try:
        follow([submitted], lambda: "serve")
    except KeyboardInterrupt:
        stop(submitted.job, cfg.cluster.executor)
        if cfg.cluster.executor is ExecutorKind.local:
            stop_left_behind(cfg.dir)


def stop(job, executor: ExecutorKind) -> None:
    """After Ctrl-C: a local job got the same SIGINT (one process group) and is stopping its
    servers: wait for it, and cancel it only if it has not ended after ``LOCAL_GRACE_S`` (a
    second signal during its teardown could leave servers behind); a SLURM job is
    cancelled (scancel: SIGTERM to every task)."""
    print(f"[pdbench] stopping job {job.job_id}: its servers stop", flush=True)
    if executor is ExecutorKind.slurm:
        job.cancel(check=False)
    start = time.monotonic()
    cancelled = executor is ExecutorKind.slurm
    while not job.done() and time.monotonic() - start < STOP_WAIT_S:
        if not cancelled and time.monotonic() - start > LOCAL_GRACE_S:
            job.cancel(check=False)
            cancelled = True
        time.sleep(1.0)


def stop_left_behind(run_dir: str, wait_s: float = 30.0) -> list[int]:
    """After a local job ended: stop what it left on this machine for ``run_dir`` (its
    ``PDBENCH_RUN_DIR``). The Ctrl-C that reached the job also reached submitit's local
    controller, which SIGKILLs the task a second later, possibly before the task stopped
    every server (seen on a loaded 2-core host: P's API server left running). SIGTERM to
    each one's process group, SIGKILL after ``wait_s``; returns the pids found."""
    left = [p for p in psutil.process_iter(["pid", "cmdline"]) if _started_for(p, run_dir)]
    found = [p.pid for p in left]
    if not left:
        return found
    names = ", ".join(f"pid {p.pid} ({' '.join(p.info['cmdline'] or [])[:80]})" for p in left)
    print(f"[pdbench] the job left {len(left)} process(es) running: {names}; stopping", flush=True)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in left:
            try:
                group = os.getpgid(proc.pid)
                if group == os.getpgrp():  # never this driver's own group
                    os.kill(proc.pid, sig)
                else:
                    os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                continue
        _, left = psutil.wait_procs(left, timeout=wait_s)
        if not left:
            break
    return found


def _started_for(proc: psutil.Process, run_dir: str) -> bool:
    try:
        return proc.environ().get(RUN_DIR_ENV) == run_dir and proc.pid != os.getpid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def serving_lines(run_dir: str | Path) -> list[str]:
    """What ``status`` says of deployments served from ``run_dir`` (``serve/*.json``)."""
    lines = []
    for path in sorted(Path(run_dir).glob("serve/*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        url = record.get("url", "")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started_at", 0)))
        if record.get("stopped_at"):
            state = f"stopped ({record.get('stopped_because') or 'stopped'})"
        else:
            flow = live_flow(url)
            state = f"serving now, flow {flow}" if flow else "not answering"
        lines.append(
            f"  serve {record.get('deployment')}: {url} model {record.get('model')} since "
            f"{started}: {state}"
        )
        lines.append(f"    requests: {record.get('request_log')}")
    return lines


def live_flow(url: str, timeout_s: float = 2.0) -> str:
    """The flow the router at ``url`` serves now ("" when it does not answer)."""
    try:
        with urllib.request.urlopen(f"{url}/pdbench/stats", timeout=timeout_s) as resp:
            return str(json.loads(resp.read()).get("flow", ""))
    except (OSError, ValueError):
        return ""
