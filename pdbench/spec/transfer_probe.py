"""The transfer preflight of one Deployment (pure): one KV-shaped NIXL read, P's device to D's.

The preflight's other checks trust presence (``ucx_info`` lists ``cuda_ipc``, ``rc``); NIXL
issues report transports listed but failing between processes, and UCX falls back to TCP
silently (NIXL #791, Dynamo #1072). So before any server starts the job moves one KV-shaped
block set from the first prefill instance's device (rank 0) to the decode instance's device
that reads from it, the way the servers will (a READ initiated by D, the plan's TP split,
the HND page layout vLLM uses for NIXL transfers, the transport's UCX settings), and records
the GB/s and the UCX transport that carried it. A read under ``floor_gb_s`` fails the
Deployment before its servers start (``jobs.preflight.checks.check_transfer``).

The probe is a one-case transfer bench (``connector.bench.runner``): ``bench_spec`` turns it into
the ``BenchSpec`` its two processes run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from connector.bench_config import BlockOrder, MemoryKind, TransferBenchConfig, XferOp
from connector.bench_plan import BenchSpec, plan_bench
from connector.layout import KVLayout, KVShape, TPSplit, model_dtype_nbytes, rank_heads
from pdbench.config.schema import KvBufferDevice, TransportConfig
from pdbench.plan.deployments import Deployment

# The read's size: one P rank's share of the model's context, but at least PROBE_MIN_BYTES
# (smaller reads are latency-bound and say little of the link) and at most PROBE_MAX_BYTES
# (half a second per read even over a 1 GB/s TCP fallback).
PROBE_MIN_BYTES = 32 << 20
PROBE_MAX_BYTES = 512 << 20
PROBE_ITERATIONS = 3  # timed reads (the median is the figure), after one warm-up read
PROBE_WARMUP = 1
PROBE_TIMEOUT_S = 90.0  # the peer process's start (torch, NIXL imports) and each read


@dataclass(frozen=True)
class TransferProbe:
    """What the transfer preflight moves, between which devices, and its floor."""

    owner: str  # the P instance whose rank 0 holds the KV (prefill0)
    owner_node: int
    owner_gpu: int  # plan device index on its node; -1: host memory
    reader: str  # the D instance that reads it
    reader_node: int
    reader_gpu: int
    memory: str  # DRAM | VRAM
    split: str  # "P TP->D TP"
    tokens: int
    model: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int
    backends: tuple[str, ...]
    ucx_tls: str
    expected_transports: tuple[str, ...]  # transport.expected_ucx_transports ((): any)
    expected_gb_s: float  # transport.expected_gb_s (0: unknown)
    floor_gb_s: float  # under this the preflight fails; 0: no floor
    iterations: int = PROBE_ITERATIONS
    warmup: int = PROBE_WARMUP
    timeout_s: float = PROBE_TIMEOUT_S
    # transport.nics_by_gpu: each side reads over its GPU's NIC, as the servers' ranks will
    nics_by_gpu: tuple[str, ...] = ()

    @property
    def shape(self) -> KVShape:
        return KVShape(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes, self.block_size
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the read: the reading D rank's heads of ``tokens`` tokens, whole blocks."""
        split = TPSplit.parse(self.split)
        heads = rank_heads(self.num_kv_heads, split.d_tp, split.ratio - 1)[1]
        blocks = self.shape.blocks_for(self.tokens)
        return self.num_layers * blocks * self.block_size * self.shape.cell_bytes * heads

    @property
    def same_node(self) -> bool:
        return self.owner_node == self.reader_node

    def side(self, node: int, gpu: int) -> str:
        return f"node{node} " + (f"GPU {gpu}" if gpu >= 0 else "DRAM")

    def describe(self) -> str:
        """The dry run's words for it."""
        floor = f"fails under {self.floor_gb_s:g} GB/s" if self.floor_gb_s > 0 else "no floor"
        return (
            f"transfer preflight: one {self.nbytes / 2**20:.0f} MiB KV read ({self.tokens} tokens, "
            f"HND, TP {self.split}, UCX_TLS={self.ucx_tls or 'default'}) by {self.reader} "
            f"({self.side(self.reader_node, self.reader_gpu)}) from {self.owner} "
            f"({self.side(self.owner_node, self.owner_gpu)}), GB/s and UCX transport "
            f"recorded, {floor}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {
            **data,
            "backends": list(self.backends),
            "expected_transports": list(data["expected_transports"]),
            "nics_by_gpu": list(self.nics_by_gpu),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransferProbe:
        return cls(
            **{
                **data,
                "backends": tuple(data["backends"]),
                "expected_transports": tuple(data.get("expected_transports", ())),
                "nics_by_gpu": tuple(data.get("nics_by_gpu", ())),
            }
        )


def floor_gb_s(transport: TransportConfig) -> float:
    """The transfer preflight's floor: ``preflight_floor_share`` of what the fabric should
    give (``expected_gb_s``); 0 (no floor) when either is 0, as on CPU transports."""
    return max(0.0, transport.preflight_floor_share) * max(0.0, transport.expected_gb_s)


def probe_tokens(shape: KVShape, bytes_per_token: int, max_model_len: int) -> int:
    """Tokens of the read: the model's context, kept within PROBE_MIN/MAX_BYTES, whole
    blocks."""
    tokens = max(max_model_len, -(-PROBE_MIN_BYTES // bytes_per_token))
    tokens = min(tokens, max(shape.block_size, PROBE_MAX_BYTES // bytes_per_token))
    return shape.blocks_for(tokens) * shape.block_size


def transfer_probe(dep: Deployment) -> TransferProbe | None:
    """The read between the Deployment's first P instance and the D rank reading its rank 0;
    None when no KV moves between instances (agg only) or the TP pair cannot move it."""
    prefill, decode = dep.by_role("prefill"), dep.by_role("decode")
    if not prefill or not decode:
        return None
    p, d = prefill[0], decode[0]
    if d.tp % p.tp:
        return None  # validation refuses such a pairing; nothing to measure
    split = TPSplit(p.tp, d.tp)
    model = dep.model
    shape = KVShape(
        num_layers=int(model.num_layers),
        num_kv_heads=int(model.num_kv_heads),
        head_dim=int(model.resolved_head_dim),
        dtype_bytes=model_dtype_nbytes(str(model.dtype)),
        block_size=int(dep.server.block_size),
    )
    heads = rank_heads(shape.num_kv_heads, split.d_tp, split.ratio - 1)[1]
    per_token = shape.num_layers * shape.cell_bytes * heads
    vram = dep.transport.kv_buffer_device is KvBufferDevice.cuda and bool(p.gpus and d.gpus)
    reader_rank = split.ratio - 1  # the D rank whose read is timed (BenchCase.timed_d_rank)
    return TransferProbe(
        owner=p.name,
        owner_node=p.node,
        owner_gpu=p.gpus[0] if vram else -1,
        reader=d.name,
        reader_node=d.node,
        reader_gpu=d.gpus[reader_rank] if vram else -1,
        memory=(MemoryKind.VRAM if vram else MemoryKind.DRAM).value,
        split=str(split),
        tokens=probe_tokens(shape, per_token, int(model.max_model_len)),
        model=str(model.name),
        dtype=str(model.dtype),
        num_layers=shape.num_layers,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype_bytes=shape.dtype_bytes,
        block_size=shape.block_size,
        backends=tuple(dep.transport.backends),
        ucx_tls=dep.transport.ucx_tls,
        expected_transports=tuple(dep.transport.expected_ucx_transports),
        expected_gb_s=float(dep.transport.expected_gb_s),
        floor_gb_s=floor_gb_s(dep.transport),
        nics_by_gpu=tuple(dep.transport.nics_by_gpu) if vram else (),
    )


def bench_spec(probe: TransferProbe, env: dict[str, str] | None = None) -> BenchSpec:
    """The one-case transfer bench both processes of the probe run."""
    bench = TransferBenchConfig(
        tokens=[probe.tokens],
        layouts=[KVLayout.HND],
        tp_splits=[probe.split],
        ops=[XferOp.READ],
        ucx_tls=[probe.ucx_tls],
        memory=MemoryKind(probe.memory),
        block_order=BlockOrder.scattered,
        iterations=probe.iterations,
        warmup=probe.warmup,
        memcpy_iterations=1,
        memcpy_min_bytes=0,
        rendezvous_timeout_s=probe.timeout_s,
        step_timeout_s=probe.timeout_s,
    )
    return plan_bench(
        bench,
        model=probe.model,
        dtype=probe.dtype,
        shape=probe.shape,
        backends=list(probe.backends),
        expected_gb_s=probe.expected_gb_s,
        env=env,
    )


def transfer_back_probe(dep: Deployment) -> TransferProbe | None:
    """The read the other way, P reading D (what a pull is: P's rank 0 reads the D rank's
    blocks of the history), for a Deployment whose flows pull (``bidirectional``) on GPUs.
    On GPUs the two directions need not take one path (GPUDirect RDMA, NVLink P2P may work
    one way only); in host memory they do, and the forward read stands for both."""
    forward = transfer_probe(dep)
    if forward is None or not dep.bidirectional or forward.memory != MemoryKind.VRAM.value:
        return None
    split = TPSplit.parse(forward.split)
    heads = rank_heads(forward.num_kv_heads, split.d_tp, split.ratio - 1)[1]
    return replace(
        forward,
        owner=forward.reader,
        owner_node=forward.reader_node,
        owner_gpu=forward.reader_gpu,
        reader=forward.owner,
        reader_node=forward.owner_node,
        reader_gpu=forward.owner_gpu,
        split="1->1",  # one D rank's heads, read whole by P's rank
        num_kv_heads=heads,
    )
