"""``python -m pdbench serve``: start one deployment for any client and keep it up.

The same plan, launch spec and job as a run (``pdbench.driver.launch``), with the spec's
``serve_flow`` set: the job warms up, then serves that flow (``flow.serve``, else the first of
``flow.flows``)
until it is stopped, measuring no Point (``jobs.run.serve``). This process follows the job
and echoes its lines, the router's URL and the model among them; Ctrl-C stops the job (its
servers stop) as it stops a run's (``pdbench.driver.submit.stopping_jobs_on``). On SLURM the
job also ends at its time limit (no requeue).
``python -m pdbench status dir=...`` shows the serving deployment and its URL.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from connector.process_env import bearer
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
        "one value for each deployment axis (flow.kv_recompute_threshold, "
        "flow.decoder_kv_blocks_ttl_s)",
    )


def served_flow(cfg: RunConfig) -> str:
    """The flow ``serve`` serves: ``flow.serve`` (a one-flow group file names its own), else
    the first of ``flow.flows``; ConfigError when the deployment cannot serve it."""
    f = cfg.flow
    flow = f.serve or f.flows[0]
    if flow not in f.flows:
        raise ConfigError(
            [
                ConfigProblem(
                    "flow.serve",
                    flow.value,
                    f"is not among flow.flows {[x.value for x in f.flows]}: the deployment "
                    "would start without what it needs (D keeping its KV, a policy)",
                    f"flow.serve={f.flows[0].value}, or add {flow.value} to flow.flows",
                )
            ]
        )
    return flow.value


def serve(cfg: RunConfig, origin: LaunchOrigin) -> None:
    """Plan one deployment, print its launch (dry run) or start it and follow it until it
    stops."""
    plan = make_plan(cfg)
    problem = serve_problem(plan)
    if problem is not None:
        raise ConfigError([problem])
    flow = served_flow(cfg)
    run_dir = RunDir.open(cfg, plan, origin, claim=not cfg.launch.dry_run)
    model_path = model_path_for(cfg, create=not cfg.launch.dry_run)
    spec = build_launch(cfg, plan, model_path, None, cluster_servers_vllm(cfg.cluster))
    spec = serving_spec(spec, flow)
    if cfg.launch.dry_run:
        print(describe(spec, plan))
        return
    write_manifest([run_dir.config], plan, run_dir.store, model_path, origin)
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
    follow([submitted], lambda: "serve")


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
        request = urllib.request.Request(f"{url}/pdbench/stats", headers=bearer(os.environ))
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return str(json.loads(resp.read()).get("flow", ""))
    except (OSError, ValueError):
        return ""
