"""The sbatch text of the cluster presets, pinned by golden files in tests/unit/golden/.

After an intended change, regenerate and review the diff:
    PDBENCH_UPDATE_GOLDEN=1 pytest tests/unit/test_sbatch_golden.py
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from pdbench.config.schema import ClusterConfig, ExecutorKind, register_configs
from pdbench.spec.sbatch import sbatch_script, submitit_command

pytestmark = pytest.mark.unit

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
FOLDER = "/RUN/submitit"  # a fixed run folder: no run-specific paths in the golden text
PYTHON = "/ENV/bin/python"  # stands in for the driver's interpreter when a preset has none


def compose_cluster(name: str) -> ClusterConfig:
    """The cluster preset ``name`` as the driver sees it, machine settings at their defaults."""
    register_configs()
    GlobalHydra.instance().clear()
    machine = [key for key in os.environ if key.startswith(("PDBENCH_SLURM_", "PDBENCH_VENV"))]
    with mock.patch.dict(os.environ):
        for key in machine:
            del os.environ[key]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(overrides=[f"+cluster={name}"])
        cluster = OmegaConf.to_object(cfg.cluster)
    GlobalHydra.instance().clear()
    assert isinstance(cluster, ClusterConfig)
    return dataclasses.replace(cluster, python=cluster.python or PYTHON)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN_DIR / f"{name}.txt"
    if os.environ.get("PDBENCH_UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with PDBENCH_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"sbatch text differs from {path}"


@pytest.mark.parametrize(
    ("preset", "nodes", "array_size", "golden"),
    [
        ("slurm", 2, 1, "slurm_2nodes"),
        ("h100_8gpu", 1, 1, "h100_8gpu_1node"),
        ("h100_8gpu", 2, 1, "h100_8gpu_2nodes"),
        ("h100_8gpu", 2, 3, "h100_8gpu_2nodes_array3"),
    ],
)
def test_sbatch_golden(preset: str, nodes: int, array_size: int, golden: str) -> None:
    cluster = compose_cluster(preset)
    text = sbatch_script(cluster, nodes, f"pdbench-{golden}", FOLDER, array_size=array_size)
    check_golden(golden, text)


def test_default_command_is_submitits() -> None:
    cluster = compose_cluster("slurm")
    text = sbatch_script(cluster, 2, "j", FOLDER)
    assert text.rstrip().endswith(submitit_command(FOLDER, PYTHON))
    assert f"{PYTHON} -u -m submitit.core._submit {FOLDER}" in text


def test_explicit_command() -> None:
    text = sbatch_script(compose_cluster("slurm"), 1, "j", FOLDER, command="echo hi")
    assert text.rstrip().endswith("echo hi")
    assert "#SBATCH --nodes=1" in text


def test_machine_settings_come_from_the_environment() -> None:
    env = {"PDBENCH_SLURM_ACCOUNT": "proj42", "PDBENCH_SLURM_PARTITION": "h100q"}
    register_configs()
    GlobalHydra.instance().clear()
    with (
        mock.patch.dict(os.environ, env),
        initialize_config_dir(config_dir=str(CONF_DIR), version_base=None),
    ):
        cluster = OmegaConf.to_object(compose(overrides=["+cluster=h100_8gpu"]).cluster)
    GlobalHydra.instance().clear()
    text = sbatch_script(cluster, 1, "j", FOLDER)
    assert "#SBATCH --account=proj42" in text
    assert "#SBATCH --partition=h100q" in text


def test_non_slurm_cluster_has_no_sbatch_script() -> None:
    with pytest.raises(ValueError, match="only executor=slurm"):
        sbatch_script(ClusterConfig(executor=ExecutorKind.local), 1, "j", FOLDER)


@pytest.mark.parametrize("preset", ["local", "debug", "slurm", "h100_8gpu"])
def test_every_preset_composes(preset: str) -> None:
    cluster = compose_cluster(preset)
    assert cluster.name == preset
