"""What `launch.dry_run=true` prints for GPU-cluster deployments, pinned by golden files:
the launch spec (pdbench/spec/launch.py) of every Deployment (each server's and the router's
command line, environment and log per node), the points and the sbatch script as submitted.

After an intended change, regenerate and review the diff:
    PDBENCH_UPDATE_GOLDEN=1 pytest tests/unit/test_dry_run_golden.py
"""

from __future__ import annotations

import os
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from pdbench.config.schema import RunConfig, register_configs
from pdbench.driver.tiny_model import model_path_for
from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import build_launch, describe
from pdbench.spec.vllm_install import VllmInstall, servers_vllm
from pdbench.validate.rules import validate
from tests.unit.test_sbatch_golden import CONF_DIR, check_golden

pytestmark = pytest.mark.unit

LLAMA_8B = ["model=llama3_8b", "model.path=/shared/models/Llama-3.1-8B-Instruct"]
LLAMA_70B = ["model=llama3_70b", "model.path=/shared/models/Llama-3.1-70B-Instruct"]
CASES = {
    "dry_llama3_8b_1p1d_tp1_nvlink": LLAMA_8B + ["topology=1p1d", "transport=nvlink"],
    "dry_llama3_8b_p2_d4_nvlink": LLAMA_8B + ["topology=p2_d4", "transport=nvlink"],
    "dry_llama3_8b_2p2d_cross_rdma": LLAMA_8B + ["topology=2p2d_cross", "transport=rdma"],
    "dry_llama3_70b_1p1d_tp4_nvlink": LLAMA_70B + ["topology=1p1d_tp4", "transport=nvlink"],
    # Two Deployments: SLURM gets them as one job array, and the dry run shows that array.
    "dry_llama3_8b_1p1d_cross_rdma_thresholds": LLAMA_8B
    + ["topology=1p1d_cross", "transport=rdma", "flow.kv_recompute_threshold=[0,1024]"],
    # Every task in a pyxis container: its options on srun in the sbatch script.
    "dry_llama3_8b_1p1d_nvlink_container": LLAMA_8B
    + [
        "topology=1p1d",
        "transport=nvlink",
        "cluster.container_image=/shared/images/pdbench-gpu.sqsh",
        "cluster.container_has_pdbench=true",
        "cluster.python=python3",
        "cluster.container_mounts=[/shared:/shared,/shared/models:/shared/models:ro]",
        "cluster.srun_args=['--mpi=none']",
        "dir=/shared/RUN",  # in the container at its own path, as every task reads it
    ],
}
# The driver's venv on a GPU cluster's shared filesystem (the nodes run its interpreter:
# cluster.python ''), with the CUDA build and its CLI beside the interpreter.
DRIVER_PYTHON = "/ENV/bin/python"
DRIVER_VLLM = VllmInstall("vllm", "0.32.0", "/ENV/bin/vllm")
BASE = [
    "+experiment=smoke",
    "cluster=h100_8gpu",
    "cluster.nodes=2",
    "dir=/RUN",
    "cache_dir=/CACHE",
]


def compose_run(overrides: list[str]) -> RunConfig:
    register_configs()
    GlobalHydra.instance().clear()
    machine = [k for k in os.environ if k.startswith(("PDBENCH_SLURM_", "PDBENCH_VENV"))]
    with mock.patch.dict(os.environ):
        for key in machine:
            del os.environ[key]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
    GlobalHydra.instance().clear()
    cfg.cluster.python = cfg.cluster.python or DRIVER_PYTHON  # '' is the driver's sys.executable
    return cfg


def dry_run_text(cfg: RunConfig) -> str:
    """What ``launch.dry_run=true`` prints for a fresh run dir (every Deployment pending)."""
    plan = make_plan(cfg)
    vllm = servers_vllm(cfg.cluster.python, DRIVER_VLLM, cfg.cluster.container_has_pdbench)
    spec = build_launch(cfg, plan, model_path_for(cfg, create=False), vllm=vllm)
    return describe(spec, plan)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_text_is_pinned(name):
    cfg = compose_run(BASE + CASES[name])
    assert validate(cfg) == [], [str(p) for p in validate(cfg)]
    text = dry_run_text(cfg)
    check_golden(name, text)


def test_cross_node_rdma_sets_ucx_and_binds_node_addresses():
    cfg = compose_run(BASE + CASES["dry_llama3_8b_2p2d_cross_rdma"])
    text = dry_run_text(cfg)
    assert "UCX_TLS=rc," in text
    assert "UCX_NET_DEVICES=" not in text  # UCX picks each GPU's NIC; no one port for all
    assert "--host '<node1>'" in text and "127.0.0.1" not in text
    assert text.count("#SBATCH --nodes=2") == 1


def test_servers_start_with_vllm_serve_and_containers_go_on_srun():
    text = dry_run_text(compose_run(BASE + CASES["dry_llama3_8b_1p1d_nvlink_container"]))
    # the image's vllm (containers/pdbench-gpu.Dockerfile), on its PATH
    assert "      vllm serve /shared/models/Llama-3.1-8B-Instruct --served-model-name" in text
    assert "vllm.entrypoints.openai.api_server" not in text
    srun = next(line for line in text.splitlines() if line.strip().startswith("srun "))
    assert srun.endswith(
        "--container-image=/shared/images/pdbench-gpu.sqsh "
        "--container-mounts=/shared:/shared,/shared/models:/shared/models:ro "
        "--no-container-entrypoint --no-container-mount-home "
        "--container-env=HF_HUB_OFFLINE,NCCL_IB_HCA,NCCL_SOCKET_IFNAME,UCX_IB_GPU_DIRECT_RDMA "
        "--mpi=none python3 -u -m submitit.core._submit /shared/RUN/submitit"
    )
