"""What the preflight checks, derived from the launch spec (pure): one expectation per node.

``PreflightSpec`` is the preflight's only input. ``spec_from_launch`` builds it from one
Deployment's launch spec (``pdbench.spec.launch.DeploymentSpec``: its instances' nodes,
GPUs and environment, the model, the interpreter, the expected UCX transports): what the
dry run prints is what the preflight checks and what the job then starts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from connector.ucx import expand
from pdbench.config.schema import RunConfig
from pdbench.plan.deployments import make_plan
from pdbench.spec.launch import DeploymentSpec, InstanceSpec, build_launch
from pdbench.spec.transfer_probe import TransferProbe

# The modules a server imports that a broken install breaks first: vLLM, NIXL, and
# pdbench's connector plugin, which subclasses vLLM 0.32's NixlConnector internals.
IMPORTS = ("vllm", "nixl", "connector.plugin.vllm_plugin")


@dataclass(frozen=True)
class NodeExpectation:
    """What one plan node (== task rank) needs."""

    node: int
    gpus: tuple[int, ...]  # device indices its instances use; () on CPU
    # (decode GPU, prefill GPU) pairs whose KV must move over NVLink (CUDA IPC).
    nvlink_pairs: tuple[tuple[int, int], ...] = ()
    # TCP ports its servers and router will listen on (HTTP, NIXL side channel, KV params)
    ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class PreflightSpec:
    nodes: tuple[NodeExpectation, ...]
    run_dir: str
    model_path: str  # a directory or a hub id, as the servers' --model
    # Variables the servers get on top of the job's environment that the checks depend on
    # (UCX_*, HF_*): the UCX probe runs with them.
    server_env: dict[str, str] = field(default_factory=dict)
    expected_ucx_transports: tuple[str, ...] = ()
    gpu_memory_gib: float = 0.0  # 0: not compared
    python: str = ""  # interpreter of the servers; "": this one
    imports: tuple[str, ...] = IMPORTS
    # Every task on one machine (local executor): servers bind loopback, on purpose.
    local: bool = False
    server_cli: str = ""  # the ``vllm`` CLI servers start with (``vllm serve``); "": a module
    # One KV-shaped NIXL read from P's device to D's (``jobs.preflight.transfer``); None: none
    transfer: TransferProbe | None = None
    # ... and from D's device to P's, as a pull reads (GPUs, flows that pull); None: none
    transfer_back: TransferProbe | None = None
    # GPU servers that compile at their first start (no --enforce-eager: torch.compile and
    # CUDA graphs build Triton's driver stub): a C compiler and Python.h must be there
    compiles: bool = False
    # UCX registers the KV cache for RDMA (rc/dc/ud transports): locked memory must allow it
    registers_memory: bool = False

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def node(self, rank: int) -> NodeExpectation:
        return self.nodes[rank] if rank < len(self.nodes) else NodeExpectation(rank, ())

    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "node": n.node,
                    "gpus": list(n.gpus),
                    "nvlink_pairs": [list(p) for p in n.nvlink_pairs],
                    "ports": list(n.ports),
                }
                for n in self.nodes
            ],
            "run_dir": self.run_dir,
            "model_path": self.model_path,
            "server_env": dict(self.server_env),
            "expected_ucx_transports": list(self.expected_ucx_transports),
            "gpu_memory_gib": self.gpu_memory_gib,
            "python": self.python,
            "imports": list(self.imports),
            "local": self.local,
            "server_cli": self.server_cli,
            "transfer": self.transfer.to_dict() if self.transfer else None,
            "transfer_back": self.transfer_back.to_dict() if self.transfer_back else None,
            "compiles": self.compiles,
            "registers_memory": self.registers_memory,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreflightSpec:
        nodes = tuple(
            NodeExpectation(
                n["node"],
                tuple(n["gpus"]),
                tuple(tuple(p) for p in n["nvlink_pairs"]),
                tuple(n.get("ports", ())),
            )
            for n in data["nodes"]
        )
        return cls(
            nodes=nodes,
            run_dir=data["run_dir"],
            model_path=data["model_path"],
            server_env=dict(data.get("server_env", {})),
            expected_ucx_transports=tuple(data.get("expected_ucx_transports", ())),
            gpu_memory_gib=float(data.get("gpu_memory_gib", 0.0)),
            python=data.get("python", ""),
            imports=tuple(data.get("imports", IMPORTS)),
            local=bool(data.get("local", False)),
            compiles=bool(data.get("compiles", False)),
            registers_memory=bool(data.get("registers_memory", False)),
            server_cli=data.get("server_cli", ""),
            transfer=TransferProbe.from_dict(data["transfer"]) if data.get("transfer") else None,
            transfer_back=(
                TransferProbe.from_dict(data["transfer_back"])
                if data.get("transfer_back")
                else None
            ),
        )


def nvlink_pairs(instances: list[InstanceSpec]) -> tuple[tuple[int, int], ...]:
    """(D GPU, P GPU) pairs that move KV, for P and D instances on the same node.

    The NIXL connector fans out: D rank ``r`` reads from P rank ``r // (d_tp // p_tp)``.
    """
    pairs: set[tuple[int, int]] = set()
    for p in (i for i in instances if i.role == "prefill"):
        for d in (i for i in instances if i.role == "decode" and i.node == p.node):
            if not p.gpus or not d.gpus or d.tp % p.tp:
                continue
            fan = d.tp // p.tp
            pairs.update((d.gpus[r], p.gpus[r // fan]) for r in range(d.tp))
    return tuple(sorted(pairs))


# Variables of an instance's environment that belong to that instance alone (its ports,
# devices, cores, logging), not to the stack every server of the node shares.
PER_INSTANCE_ENV = frozenset(
    {
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "VLLM_PORT",
        "PYTHONUNBUFFERED",
        "CUDA_VISIBLE_DEVICES",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
        "OMP_NUM_THREADS",
        "UCX_PROTO_INFO",
    }
)


def server_env(instances: list[InstanceSpec]) -> dict[str, str]:
    """The variables the servers run with that the checks depend on (UCX_*, HF_*, the
    transport's and server's env): a P/D instance's environment minus its own ports,
    devices and pdbench's bookkeeping."""
    pd = [i for i in instances if i.role != "mixed"] or instances
    if not pd:
        return {}
    return {
        k: v
        for k, v in pd[0].env.items()
        if k not in PER_INSTANCE_ENV and not k.startswith("PDBENCH_")
    }


def server_cli(instances: list[InstanceSpec]) -> str:
    """The CLI the servers start with (``<cli> serve MODEL``), "" when they run a module."""
    for inst in instances:
        if len(inst.command) > 1 and inst.command[1] == "serve":
            return inst.command[0]
    return ""


def node_ports(dep: DeploymentSpec, node: int) -> tuple[int, ...]:
    """The TCP ports the servers and the router of ``node`` will listen on."""
    ports = set()
    for inst in dep.on_node(node):
        ports |= {inst.http_port, inst.side_channel_port, inst.kv_params_port}
    if dep.router.node == node:
        ports.add(dep.router.port)
    return tuple(sorted(p for p in ports if p > 0))


RDMA_PREFIXES = ("rc", "dc", "ud", "ib")  # UCX transports that register memory with the NIC


def spec_from_launch(dep: DeploymentSpec) -> PreflightSpec:
    """The preflight of one Deployment, from its launch spec."""
    intra_node_ipc = "cuda_ipc" in expand(dep.expected_ucx_transports)
    expectations = []
    for node in range(dep.nodes):
        here = dep.on_node(node)
        gpus = tuple(sorted({g for i in here for g in i.gpus}))
        pairs = nvlink_pairs(here) if intra_node_ipc else ()
        expectations.append(NodeExpectation(node, gpus, pairs, node_ports(dep, node)))
    return PreflightSpec(
        nodes=tuple(expectations),
        run_dir=dep.run_dir,
        model_path=dep.model_path,
        server_env=server_env(dep.instances),
        expected_ucx_transports=tuple(dep.expected_ucx_transports),
        gpu_memory_gib=dep.gpu_memory_gib,
        python=dep.python,
        local=dep.local,
        server_cli=server_cli(dep.instances),
        transfer=dep.transfer,
        transfer_back=dep.transfer_back,
        compiles=any(i.gpus and "--enforce-eager" not in i.command for i in dep.instances),
        registers_memory=any(t.startswith(RDMA_PREFIXES) for t in dep.expected_ucx_transports),
    )


def spec_from_config(cfg: RunConfig, model_path: str) -> PreflightSpec:
    """The preflight of ``cfg``'s first Deployment (every Deployment of a run places the
    same instances on the same nodes)."""
    launch = build_launch(cfg, make_plan(cfg), model_path)
    return spec_from_launch(launch.deployments[0])
