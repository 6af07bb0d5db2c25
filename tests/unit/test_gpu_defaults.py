"""Defaults that differ on GPU clusters: chosen by ``by_device`` in conf/config.yaml."""

from __future__ import annotations

import pytest

from pdbench.config.schema import by_device
from pdbench.plan.deployments import make_plan
from pdbench.spec.serve_command import kv_transfer_config, serve_command
from tests.unit.test_dry_run_golden import LLAMA_8B, compose_run

pytestmark = pytest.mark.unit

CPU = ["+experiment=smoke", "dir=/R", "cache_dir=/C"]
GPU = CPU + ["cluster=h100_8gpu", "transport=nvlink", *LLAMA_8B]


def first_command(cfg) -> tuple[list[str], dict]:
    dep = make_plan(cfg).deployments[0]
    cmd = serve_command(dep, dep.instances[0], "/m", "<node0>", "python")
    return cmd, kv_transfer_config(dep)


def test_by_device_picks_by_gpu_count():
    assert by_device(8, "fail", "recompute") == "fail"
    assert by_device(0, "fail", "recompute") == "recompute"


def test_gpu_clusters_fail_a_failed_kv_load_and_use_cuda_graphs():
    cfg = compose_run(GPU)
    assert cfg.server.kv_load_failure_policy == "fail"
    assert cfg.server.startup_timeout_s == 1800.0
    cmd, kv = first_command(cfg)
    assert kv["kv_load_failure_policy"] == "fail"
    assert "--enforce-eager" not in cmd


def test_cpu_presets_keep_recompute_and_eager_mode():
    cfg = compose_run(CPU)
    assert (cfg.server.kv_load_failure_policy, cfg.server.startup_timeout_s) == ("recompute", 300)
    cmd, kv = first_command(cfg)
    assert kv["kv_load_failure_policy"] == "recompute"
    assert "--enforce-eager" in cmd


def test_an_explicit_choice_wins_over_the_device_default():
    cfg = compose_run(
        GPU + ["server.kv_load_failure_policy=recompute", "server.enforce_eager=true"]
    )
    cmd, kv = first_command(cfg)
    assert kv["kv_load_failure_policy"] == "recompute" and "--enforce-eager" in cmd
