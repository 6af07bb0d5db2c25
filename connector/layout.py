"""Geometry of a paged KV cache and the NIXL descriptor lists a block transfer needs.

Pure arithmetic: no torch, no nixl. Offsets are relative to the start of one TP rank's
KV buffer; the bench adds the buffer's base address.

The model follows vLLM 0.32's NIXL connector (``nixl/base_worker.py``,
``v1/kv_cache_layout.py``):

- one KV region per attention layer, ``num_blocks`` pages each; the rank buffer holds the
  layers back to back (layer ``l`` starts at ``l * num_blocks * page_bytes``);
- a page (one block of one layer) is ``[H, N, C]`` (``HND``, head-major, vLLM's ``LBHNC``)
  or ``[N, H, C]`` (``NHD``, token-major, ``LBNHC``): ``H`` the rank's KV heads, ``N`` the
  block size in tokens, ``C = 2 * head_dim * dtype_bytes`` (K and V packed per cell);
- a transfer has one descriptor per (layer, block) when the run it moves is one page;
- heterogeneous TP is fan-out only: D TP a multiple of P TP. D rank ``r`` reads from P rank
  ``r // (d_tp // p_tp)`` the heads it owns. In HND that head slice is one contiguous run per
  page; in NHD it is ``N`` runs per page (one per token), which is why vLLM permutes NHD
  caches to HND for hetero-TP transfers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

# ---- model arithmetic: the one place (validation, the transfer bench, analysis) ----

# Bytes per element of a dtype name: vLLM's ``--dtype`` values and the KV-cache ones.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
# ``model.dtype=auto``: the checkpoint's own dtype, bfloat16 for the models pdbench ships.
AUTO_DTYPE_BYTES = 2


def dtype_nbytes(dtype: str) -> int:
    """Bytes per element of a dtype name (``"bfloat16"`` -> 2); ``ValueError`` for a name
    with no fixed size (``auto``) or an unknown one."""
    key = str(dtype).lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise ValueError(f"unknown KV dtype {str(dtype)!r}; known: {known}")
    return DTYPE_BYTES[key]


def model_dtype_nbytes(dtype: str) -> int:
    """Bytes per weight and KV element of a model served with ``--dtype dtype``; ``auto``
    (or none) is the checkpoint's own (``AUTO_DTYPE_BYTES``)."""
    return AUTO_DTYPE_BYTES if str(dtype) in ("auto", "") else dtype_nbytes(dtype)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V for one token, all layers, of ``num_kv_heads`` heads (a whole model,
    or one TP rank's heads: ``kv_heads_per_rank``)."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads one rank of a ``tp``-way instance holds: an even share, or one replicated
    head when there are more ranks than heads (vLLM's rule; ``rank_heads``)."""
    return max(1, num_kv_heads // max(1, tp))


def llama_parameter_count(
    *,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_attention_heads: int,
    num_kv_heads: int,
    head_dim: int,
    vocab_size: int,
    tie_word_embeddings: bool,
) -> int:
    """Parameters of a Llama-shaped decoder: per layer the Q, K, V, O projections, the gated
    MLP's three matrices and two norms; the embeddings (and an untied LM head); the final
    norm."""
    q_out, kv_out = num_attention_heads * head_dim, num_kv_heads * head_dim
    attention = hidden_size * (2 * q_out + 2 * kv_out)
    mlp = 3 * hidden_size * intermediate_size
    embeddings = vocab_size * hidden_size * (1 if tie_word_embeddings else 2)
    return num_layers * (attention + mlp + 2 * hidden_size) + embeddings + hidden_size


def parameters_of(shape: Any, head_dim: int | None = None) -> int:
    """``llama_parameter_count`` of anything with a model shape's attributes (a config's
    model settings, ``records.model.ModelShape``); ``head_dim``: the resolved one, where
    ``shape.head_dim`` may be 0 (hidden / heads)."""
    return llama_parameter_count(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_layers=shape.num_layers,
        num_attention_heads=shape.num_attention_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=head_dim or shape.head_dim,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
    )


# ---- KV cache geometry ----


class KVLayout(Enum):
    """Order of a page's interior: head-major (``HND``) or token-major (``NHD``)."""

    NHD = "NHD"
    HND = "HND"


@dataclass(frozen=True)
class KVShape:
    """The model dimensions that size a KV cache, and the block size of its pages."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int

    def __post_init__(self) -> None:
        kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes)
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")

    @property
    def cell_bytes(self) -> int:
        """K and V of one head for one token in one layer."""
        return 2 * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token, all layers, all heads (whole model, no TP split)."""
        return kv_bytes_per_token(
            self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes
        )

    @property
    def bytes_per_block(self) -> int:
        """One block of tokens, all layers, all heads (whole model, no TP split)."""
        return self.bytes_per_token * self.block_size

    def blocks_for(self, tokens: int) -> int:
        """Blocks holding ``tokens`` tokens (the last one possibly partly filled)."""
        if tokens < 1:
            raise ValueError(f"tokens must be >= 1, got {tokens}")
        return -(-tokens // self.block_size)


@dataclass(frozen=True)
class TPSplit:
    """A prefill TP -> decode TP pairing; only fan-out (D TP a multiple of P TP) exists."""

    p_tp: int
    d_tp: int

    def __post_init__(self) -> None:
        if self.p_tp < 1 or self.d_tp < 1:
            raise ValueError(f"TP sizes must be >= 1, got P TP={self.p_tp}, D TP={self.d_tp}")
        if self.d_tp % self.p_tp:
            raise ValueError(
                f"unsupported TP pairing P TP={self.p_tp} -> D TP={self.d_tp}: decode TP must "
                "be a multiple of prefill TP (vLLM's NIXL connector reads heads fan-out only)"
            )

    @classmethod
    def parse(cls, text: str) -> TPSplit:
        """``"1->2"`` -> ``TPSplit(1, 2)``."""
        parts = str(text).replace(" ", "").split("->")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"TP split {text!r} is not of the form 'P->D', e.g. '1->2'")
        return cls(int(parts[0]), int(parts[1]))

    @property
    def ratio(self) -> int:
        return self.d_tp // self.p_tp

    def __str__(self) -> str:
        return f"{self.p_tp}->{self.d_tp}"


def rank_heads(num_kv_heads: int, tp: int, rank: int) -> tuple[int, int]:
    """(first KV head, KV head count) held by TP ``rank`` of ``tp``.

    Heads are split evenly; with more ranks than heads each rank holds one replicated head
    (vLLM's rule). Other counts cannot be split and raise.
    """
    if not 0 <= rank < tp:
        raise ValueError(f"rank {rank} outside TP size {tp}")
    if tp <= num_kv_heads:
        if num_kv_heads % tp:
            raise ValueError(f"{num_kv_heads} KV heads cannot be split evenly over TP={tp}")
        count = num_kv_heads // tp
        return rank * count, count
    if tp % num_kv_heads:
        raise ValueError(f"TP={tp} is not a multiple of the {num_kv_heads} KV heads")
    return rank * num_kv_heads // tp, 1


@dataclass(frozen=True)
class RankCache:
    """One TP rank's paged KV buffer: ``num_layers`` regions of ``num_blocks`` pages."""

    shape: KVShape
    layout: KVLayout
    heads: int
    num_blocks: int

    @property
    def page_bytes(self) -> int:
        """One block of one layer on this rank."""
        return self.heads * self.shape.block_size * self.shape.cell_bytes

    @property
    def block_bytes(self) -> int:
        """One block, all layers, this rank's heads: what moving one block costs."""
        return self.shape.num_layers * self.page_bytes

    @property
    def region_bytes(self) -> int:
        return self.num_blocks * self.page_bytes

    @property
    def nbytes(self) -> int:
        return self.shape.num_layers * self.region_bytes

    def regions(self) -> list[tuple[int, int]]:
        """(offset, length) of each layer's region, in layer order."""
        return [
            (layer * self.region_bytes, self.region_bytes) for layer in range(self.shape.num_layers)
        ]

    def page_offset(self, layer: int, block: int) -> int:
        if not 0 <= block < self.num_blocks:
            raise ValueError(f"block {block} outside the cache's {self.num_blocks} blocks")
        return layer * self.region_bytes + block * self.page_bytes

    def head_runs(self, first_head: int, count: int) -> list[tuple[int, int]]:
        """(offset within a page, length) of the runs holding heads ``[first, first+count)``."""
        if first_head < 0 or count < 1 or first_head + count > self.heads:
            raise ValueError(
                f"heads [{first_head}, {first_head + count}) outside the page's {self.heads}"
            )
        n, c = self.shape.block_size, self.shape.cell_bytes
        if self.layout is KVLayout.HND or count == self.heads:
            return [(first_head * n * c, count * n * c)]
        return [(t * self.heads * c + first_head * c, count * c) for t in range(n)]


@dataclass(frozen=True)
class BlockTransfer:
    """Descriptor lists of one D rank's transfer of ``blocks`` blocks from/to one P rank.

    ``local`` lives on the D rank, ``remote`` on the P rank; entry ``i`` of one pairs with
    entry ``i`` of the other. Each entry is ``(offset, length, device_id)``. A pull (READ)
    is posted by D with these lists; a push (WRITE) by P with them swapped.
    """

    split: TPSplit
    d_rank: int
    p_rank: int
    p_cache: RankCache
    d_cache: RankCache
    blocks: int
    local: list[tuple[int, int, int]]
    remote: list[tuple[int, int, int]]

    @property
    def nbytes(self) -> int:
        return sum(length for _, length, _ in self.local)

    @property
    def descriptors(self) -> int:
        return len(self.local)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block costs this D rank: its heads, every layer."""
        return self.d_cache.block_bytes


def block_transfer(
    shape: KVShape,
    layout: KVLayout,
    split: TPSplit,
    d_rank: int,
    d_blocks: list[int],
    p_blocks: list[int],
    *,
    d_num_blocks: int,
    p_num_blocks: int,
    descs_per_block: int = 1,
    d_device: int = 0,
    p_device: int = 0,
) -> BlockTransfer:
    """The descriptors moving P blocks ``p_blocks`` into D blocks ``d_blocks`` (pairwise).

    Layer-major, then block, then run: the order vLLM builds them in. ``descs_per_block``
    cuts every contiguous run into that many equal descriptors (to measure what descriptor
    count costs for the same bytes).
    """
    if len(d_blocks) != len(p_blocks):
        raise ValueError(f"{len(d_blocks)} D blocks paired with {len(p_blocks)} P blocks")
    if descs_per_block < 1:
        raise ValueError(f"descs_per_block must be >= 1, got {descs_per_block}")
    p_rank = d_rank // split.ratio
    d_first, d_count = rank_heads(shape.num_kv_heads, split.d_tp, d_rank)
    p_first, p_count = rank_heads(shape.num_kv_heads, split.p_tp, p_rank)
    p_cache = RankCache(shape, layout, p_count, p_num_blocks)
    d_cache = RankCache(shape, layout, d_count, d_num_blocks)
    remote_runs = p_cache.head_runs(d_first - p_first, d_count)
    local_runs = d_cache.head_runs(0, d_count)
    if len(local_runs) != len(remote_runs):  # D holds all its heads: one run per page
        local_runs = [(i * length, length) for i, (_, length) in enumerate(remote_runs)]
    run_len = remote_runs[0][1]
    if run_len % descs_per_block:
        raise ValueError(
            f"a run of {run_len} bytes cannot be cut into {descs_per_block} equal descriptors"
        )
    piece = run_len // descs_per_block
    local: list[tuple[int, int, int]] = []
    remote: list[tuple[int, int, int]] = []
    for layer in range(shape.num_layers):
        for d_block, p_block in zip(d_blocks, p_blocks, strict=True):
            d_page = d_cache.page_offset(layer, d_block)
            p_page = p_cache.page_offset(layer, p_block)
            for (d_off, _), (p_off, _) in zip(local_runs, remote_runs, strict=True):
                for k in range(descs_per_block):
                    local.append((d_page + d_off + k * piece, piece, d_device))
                    remote.append((p_page + p_off + k * piece, piece, p_device))
    return BlockTransfer(
        split=split,
        d_rank=d_rank,
        p_rank=p_rank,
        p_cache=p_cache,
        d_cache=d_cache,
        blocks=len(d_blocks),
        local=local,
        remote=remote,
    )
