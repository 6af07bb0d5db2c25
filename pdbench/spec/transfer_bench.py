"""The transfer bench's sweep from a run config (pure): the KV geometry of ``cfg.model`` in
blocks of ``cfg.server.block_size``, and every case ``cfg.bench`` asks for
(``connector.bench_plan``). The dry run prints it, the job runs it, validation checks it."""

from __future__ import annotations

from connector.bench_plan import BenchSpec, plan_bench
from connector.layout import KVShape, dtype_nbytes
from pdbench.config.schema import RunConfig


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
        cfg.bench,
        model=str(cfg.model.name),
        dtype=str(cfg.model.dtype),
        shape=kv_shape(cfg),
        backends=list(transport.backends),
        expected_gb_s=float(transport.expected_gb_s),
        env={str(k): str(v) for k, v in transport.env.items()},
    )
