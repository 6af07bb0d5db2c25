"""A vLLM server forked from the process that imported vLLM once (``server.cpu_start=fork``,
the CPU default) is the server started on its own: the smoke deployment's P started on its
own and its D forked, side by side, give the same greedy tokens; ``status``'s and ``stop``'s
search finds the forked one by its run dir, on its port; nothing is left once the forker
closes."""

from __future__ import annotations

import json
import sys
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from jobs.run.servers import start_forker
from jobs.serving.server import ServerProcess, wait_all_ready
from pdbench.config.schema import register_configs
from pdbench.driver.leftovers import run_processes
from pdbench.driver.tiny_model import model_path_for
from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import DeploymentSpec, build_launch, forker_log
from tests.e2e.conftest import REPO, server_pids, worker_ports

pytestmark = pytest.mark.e2e

PROMPTS = ["ba ke mo na ti ru " * 8, "lo pe " * 30, "the first of many"]


def smoke_deployment(run_dir: Path) -> DeploymentSpec:
    register_configs()
    GlobalHydra.instance().clear()
    overrides = ["+experiment=smoke", f"dir={run_dir}", *worker_ports()]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    GlobalHydra.instance().clear()
    launch = build_launch(cfg, make_plan(cfg), model_path_for(cfg, create=True))
    (spec,) = launch.deployments
    return spec


def greedy(url: str) -> list[str]:
    out = []
    for prompt in PROMPTS:
        body = {"model": "tiny_llama", "prompt": prompt, "max_tokens": 12, "temperature": 0}
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(
            f"{url}/v1/completions", json.dumps(body).encode(), headers
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            out.append(json.loads(resp.read())["choices"][0]["text"])
    return out


def test_a_forked_server_answers_as_one_started_on_its_own(tmp_path):
    run_dir = tmp_path / "run"
    spec = smoke_deployment(run_dir)
    assert all(i.forked for i in spec.instances)  # the CPU default (server.cpu_start=fork)
    by_role = {i.role: i for i in spec.instances}
    alone, forked = by_role["prefill"], by_role["decode"]
    with ExitStack() as stack:
        forker = start_forker(stack, [forked], forker_log(spec, 0))
        assert forker is not None and forker.module in forked.command
        procs = [
            ServerProcess(
                inst.name,
                inst.command,
                inst.env,
                Path(inst.log_path),
                inst.health_url,
                cpus=inst.cpus,
                forker=forker if inst is forked else None,
            )  # fmt: skip
            for inst in (alone, forked)
        ]
        for proc in procs:
            stack.enter_context(proc)
        wait_all_ready(procs, 300, print)
        assert procs[1].proc.pid != forker.proc.pid and procs[1].forker is forker
        assert procs[0].forker is None  # started on its own: its own command line
        assert greedy(alone.url) == greedy(forked.url)
        found = {p.pid: p for p in run_processes(run_dir)}
        assert procs[1].proc.pid in found, found  # by the run dir in its environment
        assert forked.http_port in found[procs[1].proc.pid].ports
        assert forker.proc.pid in found and sys.executable in found[forker.proc.pid].command
    assert server_pids(run_dir) == [] and run_processes(run_dir) == []
