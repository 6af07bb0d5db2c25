"""The launch spec: the one builder of what runs, and what it promises (the dry run, the job
and the records see the same commands, env, paths, router config and sbatch file)."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import pytest
from submitit.slurm import slurm as submitit_slurm

from jobs.serving.router import RouterConfig
from pdbench.config.schema import Placement
from pdbench.driver.executors import SlurmJob, make_executor
from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import (
    LOOPBACK,
    DeploymentSpec,
    build_launch,
    describe,
    describe_deployment,
    node_address_placeholder,
    resolve,
)
from tests.unit.helpers import cpu_run, gpu_run

pytestmark = pytest.mark.unit


def slurm_run(**kw):
    cfg = gpu_run(**kw)
    cfg.cluster.python = "/ENV/bin/python"
    return cfg


def test_instance_env_names_the_deployment_dirs_the_job_uses():
    cfg = cpu_run()
    plan = make_plan(cfg)
    spec = build_launch(cfg, plan, "/m").deployments[0]
    dep_id = plan.deployments[0].deployment_id
    for inst in spec.instances:
        assert inst.env["PDBENCH_RUN_DIR"] == "/RUN"
        assert inst.log_path == f"/RUN/logs/{dep_id}/{inst.name}.log"
        assert inst.host == LOOPBACK and inst.health_url.startswith(f"http://{LOOPBACK}:")
    assert spec.router.env["PDBENCH_RUN_DIR"] == "/RUN"
    # D's plugin serves its KV params on the last port of D's side-channel block; the
    # router gets that URL beside D's.
    prefill, decode = spec.instances
    assert prefill.kv_params_port == 0 and "PDBENCH_KV_PARAMS_ADDR" not in prefill.env
    assert decode.kv_params_port == decode.side_channel_port + 63
    assert decode.env["PDBENCH_KV_PARAMS_ADDR"] == f"{LOOPBACK}:{decode.kv_params_port}"
    assert spec.router.config["kv_params_urls"] == [f"http://{LOOPBACK}:{decode.kv_params_port}"]
    assert spec.router.config["decode_urls"] == [decode.url]
    assert spec.placeholders() == []  # local: every address is known at plan time


def test_router_config_is_exactly_the_routers_fields_from_the_typed_config():
    cfg = cpu_run()
    cfg.workload.request_timeout_s = 77.0
    cfg.flow.cache_hit_threshold = 0.5
    spec = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    router = RouterConfig(**spec.router.config)  # no missing and no unknown key
    assert router.request_timeout_s == 77.0 and router.cache_hit_threshold == 0.5
    assert router.port == cfg.server.router_port
    p, d = spec.instances
    assert router.prefill_urls == [p.url] and router.decode_urls == [d.url]


def test_slurm_addresses_are_placeholders_until_resolved():
    cfg = slurm_run(p=2, d=2, placement=Placement.cross_node, nodes=2)
    spec = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert spec.placeholders() == ["<node0>", "<node1>"]
    decode = spec.on_node(1)[0]
    assert decode.host == node_address_placeholder(1)
    assert decode.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "<node1>"
    assert "<node1>" in decode.command
    only_mine = resolve(spec, {1: "10.0.0.2"})
    assert only_mine.placeholders() == ["<node0>"]
    ran = resolve(spec, {0: "10.0.0.1", 1: "10.0.0.2"})
    assert ran.placeholders() == []
    assert ran.router.config["decode_urls"][0] == "http://10.0.0.2:8102"
    assert ran.router.config["host"] == ran.router.host == "10.0.0.1"
    # Nothing but the addresses changed.
    back = resolve(ran, {})
    assert DeploymentSpec.from_dict(back.to_dict()) == ran
    unresolved = ran.to_dict()
    assert unresolved["instances"][2]["command"] == [
        "10.0.0.2" if a == "<node1>" else a for a in spec.instances[2].command
    ]


def test_one_submission_per_local_deployment_one_array_on_slurm():
    cfg = cpu_run()
    cfg.flow.kv_recompute_threshold = [0, 64, 256]
    plan = make_plan(cfg)
    local = build_launch(cfg, plan, "/m")
    assert [s.deployment_ids for s in local.submissions] == [
        [d.deployment_id] for d in plan.deployments
    ]
    assert all(s.sbatch == "" for s in local.submissions)

    cfg = slurm_run()
    cfg.flow.kv_recompute_threshold = [0, 64, 256]
    plan = make_plan(cfg)
    ids = [d.deployment_id for d in plan.deployments]
    (sub,) = build_launch(cfg, plan, "/m").submissions
    assert sub.deployment_ids == ids and sub.job_name == "pdbench-run"
    assert "#SBATCH --array=0-2%3" in sub.sbatch
    # Only what is not done yet is submitted: one left, one plain job.
    (one,) = build_launch(cfg, plan, "/m", pending=ids[1:2]).submissions
    assert one.deployment_ids == ids[1:2] and "--array" not in one.sbatch
    assert one.job_name == f"pdbench-{ids[1]}"


@pytest.mark.parametrize("thresholds", [[64], [0, 64, 256]])
def test_the_sbatch_file_submitit_hands_sbatch_is_the_specs(
    tmp_path: Path, thresholds, monkeypatch: pytest.MonkeyPatch
):
    """Runs submitit's real submission path (its private ``_submit_command`` and array
    handling, pinned in pyproject) with ``sbatch`` replaced by ``echo``: the file it would
    submit must equal the launch spec's text, which the dry run prints. submitit looks for
    ``srun`` on PATH before it builds anything; a machine without SLURM gets a stand-in that
    is never run, so this stays a unit test."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{os.environ.get('PATH', '')}{os.pathsep}{bin_dir}")
    cfg = slurm_run()
    cfg.dir = str(tmp_path / "run")
    cfg.flow.kv_recompute_threshold = thresholds
    plan = make_plan(cfg)
    (sub,) = build_launch(cfg, plan, "/m").submissions
    submitted: list[str] = []

    def fake_sbatch(self, path: Path) -> list[str]:
        submitted.append(Path(path).read_text())
        return ["echo", "Submitted batch job 4242"]

    executor = make_executor(cfg.cluster, Path(cfg.dir) / "submitit", sub.nodes, sub.job_name)
    slurm_class = submitit_slurm.SlurmExecutor
    sbatch = mock.patch.object(slurm_class, "_make_submission_command", fake_sbatch)
    with sbatch, executor.batch():
        jobs = [executor.submit(print, d) for d in sub.deployment_ids]
    assert submitted == [sub.sbatch]
    # Array elements come back as pdbench's SlurmJob (its squeue-aware state watcher).
    assert len(jobs) == len(thresholds) and all(isinstance(j, SlurmJob) for j in jobs)


def test_dry_run_text_lists_every_process_and_the_submission():
    cfg = slurm_run()
    cfg.flow.kv_recompute_threshold = [0, 64]
    plan = make_plan(cfg)
    text = describe(build_launch(cfg, plan, "/m"), plan)
    assert text.count("router (<node0>:8000):") == 2
    assert text.count("#!/bin/bash") == 1 and "#SBATCH --array=0-1%2" in text
    assert "submission 1 of 1: pdbench-run, an array of 2 jobs of 1 node(s)" in text


def test_a_local_dry_run_shows_the_setup_and_env_each_task_gets():
    """cluster.setup and cluster.env reach a local job through submitit's setup lines: the
    dry run prints them (issue 27: +cluster.env.FOO=bar never appeared in a local dry run),
    as a SLURM one prints them in its sbatch script."""
    cfg = cpu_run()
    cfg.cluster.env = {"FOO": "bar"}
    cfg.cluster.setup = ["ulimit -n 4096"]
    plan = make_plan(cfg)
    launch = build_launch(cfg, plan, "/m")
    (sub,) = launch.submissions
    assert sub.setup == ["ulimit -n 4096", "export FOO=bar"] and sub.sbatch == ""
    text = describe(launch, plan)
    assert "  setup (each task's shell runs it before the job):\n    ulimit -n 4096\n" in text
    assert "\n    export FOO=bar\n" in text
    slurm = slurm_run()
    slurm.cluster.env = {"FOO": "bar"}
    (sub,) = build_launch(slurm, make_plan(slurm), "/m").submissions
    assert sub.setup == [] and "export FOO=bar" in sub.sbatch  # its sbatch script says it


def test_cpu_servers_are_forked_from_one_forker_per_node_and_the_dry_run_says_so():
    """``server.cpu_start=fork`` (the default): every CPU server is forked from its node's
    forker, which the dry run prints with its log; ``exec`` starts each on its own; GPU
    servers always start on their own, whatever the setting."""
    cfg = cpu_run()
    spec = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert [i.forked for i in spec.instances] == [True, True]
    text = "\n".join(describe_deployment(spec))
    dep_id = spec.deployment_id
    python = spec.instances[0].command[0]
    assert (
        f"server forker: {python} -m jobs.serving.forkserver vllm.entrypoints.openai.api_server"
        f", log /RUN/logs/{dep_id}/server-forker.node0.log: imports the module once, forks "
        "prefill0, decode0 (server.cpu_start=fork)"
    ) in text
    assert "prefill0 (prefill, tp=1, gpus=[], cpus=[0], forked):" in text
    assert DeploymentSpec.from_dict(spec.to_dict()) == spec  # what the job reads back
    cfg.server.cpu_start = "exec"
    spec = build_launch(cfg, make_plan(cfg), "/m").deployments[0]
    assert not any(i.forked for i in spec.instances)
    assert "server forker" not in "\n".join(describe_deployment(spec))
    gpu = gpu_run()  # cpu_start=fork, the default: GPU servers are not forked
    assert not any(i.forked for d in build_launch(gpu, make_plan(gpu), "/m").deployments
                   for i in d.instances)  # fmt: skip
