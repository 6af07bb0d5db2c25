"""Settings of the KV-shaped NIXL transfer bench (``RunConfig.bench``).

The model shape comes from ``RunConfig.model`` and the block size from
``RunConfig.server.block_size``; NIXL backends and the link's expected bandwidth from
``RunConfig.transport``. Every list here is a sweep axis: the bench measures their product.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from connector.layout import KVLayout


class XferOp(Enum):
    """READ: D pulls P's blocks (vLLM's pull mode). WRITE: P pushes them into D."""

    READ = "READ"
    WRITE = "WRITE"


class MemoryKind(Enum):
    """Where the KV buffers live: host memory, or GPU memory when CUDA is there. ``auto``
    (the default): GPU memory on a cluster with GPUs, host memory otherwise (the run config
    decides: ``pdbench.spec.transfer_bench.bench_memory``)."""

    DRAM = "DRAM"
    VRAM = "VRAM"
    auto = "auto"


class BlockOrder(Enum):
    """Which cache blocks a transfer touches.

    ``scattered``: a seeded permutation, as a running server's block table looks (NIXL cannot
    merge neighbouring descriptors). ``contiguous``: blocks 0..n-1 on both sides (NIXL may
    merge descriptors; the record's ``nixl_desc_count`` says how many it really posted).
    """

    scattered = "scattered"
    contiguous = "contiguous"


@dataclass
class TransferBenchConfig:
    # History lengths in tokens whose KV is moved, one case each.
    tokens: list[int] = field(default_factory=lambda: [256, 1024, 4096])
    # KV layouts measured (HND: vLLM's NIXL layout, heads outermost; NHD).
    layouts: list[KVLayout] = field(default_factory=lambda: [KVLayout.HND, KVLayout.NHD])
    # P TP -> D TP pairs: D's ranks each read their share of every block.
    tp_splits: list[str] = field(default_factory=lambda: ["1->1", "1->2"])  # "P->D"
    # NIXL operations: READ (what the connector does: D's side pulls) and WRITE.
    ops: list[XferOp] = field(default_factory=lambda: [XferOp.READ, XferOp.WRITE])
    descs_per_block: list[int] = field(default_factory=lambda: [1])  # runs cut into N descs
    # NIXL merges descriptors adjacent on both sides (the pieces of one cut block are): false
    # posts every descriptor as built (make_prepped_xfer's skip_desc_merge).
    merge_descriptors: bool = True
    # UCX_TLS variants, each measured ("": UCX's own choice); a run config's default is its
    # transport's (conf/config.yaml: [${transport.ucx_tls}])
    ucx_tls: list[str] = field(default_factory=lambda: [""])
    # Where the buffers live: DRAM, VRAM, or auto (VRAM on a GPU cluster, DRAM on CPU).
    memory: MemoryKind = MemoryKind.auto
    # scattered (a server's block table: seeded permutation) or contiguous blocks.
    block_order: BlockOrder = BlockOrder.scattered
    # NIXL's progress thread spins one core per agent (vLLM runs with it). Off, the initiator
    # drives its transfer by polling and the target progresses while waiting for messages.
    progress_thread: bool = False
    # Timed transfers per case.
    iterations: int = 10
    # Untimed transfers before them.
    warmup: int = 2
    # Timed local copies per case: the memory bandwidth each case is compared with.
    memcpy_iterations: int = 5
    memcpy_min_bytes: int = 64 << 20  # copy at least this much: memory bandwidth, not cache
    flag_ratio: float = 0.1  # flag GB/s below this share of memcpy or transport.expected_gb_s
    flag_min_bytes: int = 1 << 20  # smaller transfers are latency-bound: never flagged
    rendezvous_timeout_s: float = 300.0  # waiting for the peer's agent (startup included)
    step_timeout_s: float = 120.0  # waiting for one transfer or one peer message
    # Seed of the scattered block order.
    seed: int = 0
