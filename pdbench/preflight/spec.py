"""What the preflight checks, derived from the plan (pure): one expectation per node.

``PreflightSpec`` is the preflight's only input. ``spec_from_config`` builds it from a typed
RunConfig and the model path the servers get (``launch.model_path_for``); once servers are
described by launch specs (one per instance: node, GPUs, command, environment), a
``spec_from_launch`` builds the same object from them, and nothing downstream changes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from pdbench.config import RunConfig
from pdbench.plan import Instance, place_instances
from pdbench.ucx_transports import expand

# The modules a server imports that a broken install breaks first: vLLM, NIXL, and
# pdbench's connector plugin, which subclasses vLLM 0.32's NixlConnector internals.
IMPORTS = ("vllm", "nixl", "connector.vllm_plugin")


@dataclass(frozen=True)
class NodeExpectation:
    """What one plan node (== task rank) needs."""

    node: int
    gpus: tuple[int, ...]  # device indices its instances use; () on CPU
    # (decode GPU, prefill GPU) pairs whose KV must move over NVLink (CUDA IPC).
    nvlink_pairs: tuple[tuple[int, int], ...] = ()


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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreflightSpec:
        nodes = tuple(
            NodeExpectation(n["node"], tuple(n["gpus"]), tuple(tuple(p) for p in n["nvlink_pairs"]))
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
        )


def nvlink_pairs(instances: list[Instance]) -> tuple[tuple[int, int], ...]:
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


def spec_from_config(cfg: RunConfig, model_path: str) -> PreflightSpec:
    """The preflight of one Deployment of ``cfg`` (every Deployment of a run shares it)."""
    instances, nodes = place_instances(cfg)
    t = cfg.transport
    intra_node_ipc = "cuda_ipc" in expand(t.expected_ucx_transports)
    expectations = []
    for node in range(nodes):
        here = [i for i in instances if i.node == node]
        gpus = tuple(sorted({g for i in here for g in i.gpus}))
        pairs = nvlink_pairs(here) if intra_node_ipc else ()
        expectations.append(NodeExpectation(node, gpus, pairs))
    env: dict[str, str] = {}
    if t.ucx_tls:
        env["UCX_TLS"] = t.ucx_tls
    if t.ucx_net_devices:
        env["UCX_NET_DEVICES"] = t.ucx_net_devices
    env.update({k: str(v) for k, v in t.env.items()})
    env.update({k: str(v) for k, v in cfg.server.env.items()})
    return PreflightSpec(
        nodes=tuple(expectations),
        run_dir=cfg.dir,
        model_path=model_path,
        server_env=env,
        expected_ucx_transports=tuple(t.expected_ucx_transports),
        gpu_memory_gib=cfg.cluster.gpu_memory_gib if cfg.cluster.gpus_per_node > 0 else 0.0,
        python=cfg.cluster.python,
    )
