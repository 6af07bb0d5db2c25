"""``python -m pdbench preflight +experiment=... [cluster=slurm]``: the preflight alone.

The same checks every Deployment's job runs first (``jobs.preflight``), submitted as a job
of their own on the nodes the plan needs (one task per node), starting no server. Echoes
each node's checks as they come, then the verdict: "preflight ok" or the ONE line of the
first failure; writes every report to ``<dir>/preflight/alone-<time>.json``; a failure
exits 1.
"""

from __future__ import annotations

import time
from pathlib import Path

from jobs.entry.preflight import PreflightJob
from pdbench.config.schema import ExecutorKind, RunConfig
from pdbench.driver.submit import check_slurm_reachable, follow, submit
from pdbench.driver.tiny_model import model_path_for
from pdbench.plan.deployments import make_plan
from pdbench.results.preflight import read_reports, reports_dir, verdict
from pdbench.results.store import write_json_atomic
from pdbench.spec.launch import build_launch, describe_preflight
from pdbench.spec.vllm_install import cluster_servers_vllm
from pdbench.validate.environment import check_environment

JOB_NAME = "pdbench-preflight"


def run_preflight_alone(cfg: RunConfig) -> str:
    """Plan, run the first Deployment's preflight on its nodes; returns the verdict ("" when
    every node passed)."""
    plan = make_plan(cfg)
    model_path = model_path_for(cfg, create=not cfg.launch.dry_run)
    spec = build_launch(cfg, plan, model_path, vllm=cluster_servers_vllm(cfg.cluster))
    dep = spec.deployments[0]  # every Deployment of a plan places the same instances
    print(f"{dep.nodes} node(s): {describe_preflight(dep)}", flush=True)
    if cfg.launch.dry_run:
        return ""
    check_environment(cfg)  # the nodes run this driver's interpreter and vLLM
    if cfg.cluster.executor is ExecutorKind.slurm:
        check_slurm_reachable()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rendezvous = Path(cfg.dir) / "preflight" / f"alone-{stamp}"
    folder = Path(spec.submitit_folder)
    work = [(f"preflight (logs in {folder})", PreflightJob(dep, str(rendezvous)))]
    submitted = submit(cfg.cluster, folder, dep.nodes, JOB_NAME, work)
    directory = reports_dir(rendezvous)
    (outcome,) = follow(
        submitted, lambda: f"{len(read_reports(directory, dep.nodes))}/{dep.nodes} nodes"
    )
    reports = read_reports(directory, dep.nodes)
    line = verdict(reports, dep.nodes, 0)
    if not line and outcome.failed:
        line = f"preflight job {outcome.job_id} failed: {outcome.error} (logs: {folder})"
    write_json_atomic(
        Path(cfg.dir) / "preflight" / f"alone-{stamp}.json",
        {"ok": not line, "line": line, "reports": [reports[r] for r in sorted(reports)]},
    )
    print(line or f"preflight ok on {dep.nodes} node(s); reports in {rendezvous}", flush=True)
    return line
