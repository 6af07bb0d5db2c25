"""The transfer bench's sweep from a run config (pure): the KV geometry of ``cfg.model`` in
blocks of ``cfg.server.block_size``, every case ``cfg.bench`` asks for
(``connector.bench_plan``), where its buffers live and where its two tasks run. The dry run
prints it, the job runs it, validation checks it.

Where: the two tasks (P owns the KV, D reads it) run on one node for a link inside a node
(``nvlink``: one GPU each), on two nodes otherwise (``rdma``, ``tcp``: the link between
them; on CPU machines, locally, two tasks here). Memory: GPU memory on a cluster with GPUs
(``bench.memory: auto``), host memory otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from connector.bench_config import MemoryKind
from connector.bench_plan import BenchSpec, plan_bench
from connector.layout import KVShape, dtype_nbytes
from pdbench.config.schema import RunConfig

ONE_NODE_TRANSPORTS = ("nvlink",)  # links inside a node: both tasks on one


@dataclass(frozen=True)
class BenchPlacement:
    """Where the bench's two tasks run."""

    nodes: int
    tasks_per_node: int

    def describe(self, gpus: bool) -> str:
        each = ", one GPU each" if gpus else ""
        if self.nodes == 1:
            return f"1 node, 2 tasks{each}"
        return f"2 nodes, 1 task each{each}"


def bench_placement(cfg: RunConfig) -> BenchPlacement:
    """One node for a link inside a node, two otherwise."""
    if cfg.transport.name in ONE_NODE_TRANSPORTS:
        return BenchPlacement(nodes=1, tasks_per_node=2)
    return BenchPlacement(nodes=2, tasks_per_node=1)


def bench_memory(cfg: RunConfig) -> MemoryKind:
    """``bench.memory``, ``auto`` resolved: VRAM on a cluster with GPUs, else DRAM."""
    if cfg.bench.memory is not MemoryKind.auto:
        return cfg.bench.memory
    return MemoryKind.VRAM if cfg.cluster.gpus_per_node > 0 else MemoryKind.DRAM


def kv_shape(cfg: RunConfig) -> KVShape:
    """The KV geometry of ``cfg.model`` with ``cfg.server.block_size`` tokens per block;
    ``ValueError`` for a dtype or size the bench cannot lay out."""
    model = cfg.model
    return KVShape(
        num_layers=int(model.num_layers),
        num_kv_heads=int(model.num_kv_heads),
        head_dim=int(model.resolved_head_dim),
        dtype_bytes=dtype_nbytes(model.dtype),
        block_size=int(cfg.server.block_size),
    )


def bench_spec(cfg: RunConfig) -> BenchSpec:
    """The whole sweep of ``cfg.bench`` for ``cfg.model`` and ``cfg.transport``."""
    transport = cfg.transport
    return plan_bench(
        replace(cfg.bench, memory=bench_memory(cfg)),
        model=str(cfg.model.name),
        dtype=str(cfg.model.dtype),
        shape=kv_shape(cfg),
        backends=list(transport.backends),
        expected_gb_s=float(transport.expected_gb_s),
        env={str(k): str(v) for k, v in transport.env.items()},
    )
