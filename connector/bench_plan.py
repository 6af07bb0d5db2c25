"""Plan the transfer bench (pure): the sweep's cases, their ids, buffers and block choices.

Both tasks of the bench job compute the same plan from the same ``BenchSpec``, so they agree
on every case, buffer size and descriptor list without exchanging them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass, field, replace

from connector.bench_config import BlockOrder, MemoryKind, TransferBenchConfig, XferOp
from connector.layout import BlockTransfer, KVLayout, KVShape, TPSplit, block_transfer, rank_heads

WORD_BYTES = 4  # the integrity pattern is one int32 per 4 bytes: descriptors must align


@dataclass(frozen=True)
class BenchCase:
    """One measured transfer shape: a record of the bench."""

    index: int
    record_id: str
    ucx_tls: str  # "" : UCX's own choice
    layout: KVLayout
    split: TPSplit
    tokens: int
    blocks: int
    op: XferOp
    descs_per_block: int

    @property
    def d_ranks(self) -> list[int]:
        """The D ranks reading from P rank 0 (all are integrity-checked)."""
        return list(range(self.split.ratio))

    @property
    def timed_d_rank(self) -> int:
        """The D rank whose transfer is timed: the last one, at a non-zero head offset."""
        return self.split.ratio - 1


@dataclass(frozen=True)
class BenchSpec:
    """Everything the bench's two tasks need, picklable for submitit."""

    model: str
    dtype: str
    shape: KVShape
    memory: MemoryKind
    backends: tuple[str, ...]
    block_order: BlockOrder
    iterations: int
    warmup: int
    memcpy_iterations: int
    flag_ratio: float
    flag_min_bytes: int
    expected_gb_s: float
    rendezvous_timeout_s: float
    step_timeout_s: float
    seed: int
    cases: tuple[BenchCase, ...]
    progress_thread: bool = False
    memcpy_min_bytes: int = 64 << 20
    merge_descriptors: bool = True
    env: dict[str, str] = field(default_factory=dict)

    @property
    def num_blocks(self) -> int:
        """Blocks in each side's cache: the largest transfer of the sweep."""
        return max((c.blocks for c in self.cases), default=1)

    def variants(self) -> list[str]:
        """UCX_TLS values in first-seen order: each gets fresh NIXL agents."""
        return list(dict.fromkeys(c.ucx_tls for c in self.cases))

    def owner_bytes(self) -> int:
        """Bytes of P rank 0's buffer, large enough for every split of the sweep."""
        return max(
            (
                self.shape.num_layers
                * self.num_blocks
                * self.shape.block_size
                * self.shape.cell_bytes
                * rank_heads(self.shape.num_kv_heads, c.split.p_tp, 0)[1]
                for c in self.cases
            ),
            default=0,
        )

    def reader_bytes(self) -> int:
        """Bytes of the D rank's buffer, large enough for every split of the sweep."""
        return max(
            (
                self.shape.num_layers
                * self.num_blocks
                * self.shape.block_size
                * self.shape.cell_bytes
                * rank_heads(self.shape.num_kv_heads, c.split.d_tp, 0)[1]
                for c in self.cases
            ),
            default=0,
        )

    def block_ids(self, case: BenchCase) -> tuple[list[int], list[int]]:
        """(D blocks, P blocks) the case moves, paired by position."""
        n = case.blocks
        if self.block_order is BlockOrder.contiguous:
            return list(range(n)), list(range(n))
        rng = random.Random(f"{self.seed}:{case.tokens}:{n}")
        pool = range(self.num_blocks)
        return rng.sample(pool, n), rng.sample(pool, n)

    def transfer(self, case: BenchCase, d_rank: int, device: int = 0) -> BlockTransfer:
        d_blocks, p_blocks = self.block_ids(case)
        return block_transfer(
            self.shape,
            case.layout,
            case.split,
            d_rank,
            d_blocks,
            p_blocks,
            d_num_blocks=self.num_blocks,
            p_num_blocks=self.num_blocks,
            descs_per_block=case.descs_per_block,
            d_device=device,
            p_device=device,
        )


def record_id(identity: dict) -> str:
    """A stable short hash of a case's identity (what it measures, not when)."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def case_identity(
    model: str,
    dtype: str,
    shape: KVShape,
    memory: MemoryKind,
    backends: tuple[str, ...],
    block_order: BlockOrder,
    ucx_tls: str,
    layout: KVLayout,
    split: TPSplit,
    tokens: int,
    op: XferOp,
    descs_per_block: int,
    merge_descriptors: bool = True,
) -> dict:
    ident = {
        "model": model,
        "dtype": dtype,
        "shape": [shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.block_size],
        "memory": memory.value,
        "backends": list(backends),
        "block_order": block_order.value,
        "ucx_tls": ucx_tls,
        "layout": layout.value,
        "tp_split": str(split),
        "tokens": tokens,
        "op": op.value,
        "descs_per_block": descs_per_block,
    }
    if not merge_descriptors:  # only when off: ids of default runs stay as they were
        ident["merge_descriptors"] = False
    return ident


@dataclass(frozen=True)
class BenchProblem:
    """One setting of the bench the sweep cannot run: where, what it is, why, what to do."""

    field: str
    value: object
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}={self.value}: {self.message}. Fix: {self.fix}"


def _splits(bench: TransferBenchConfig, shape: KVShape, out: list[BenchProblem]) -> list[TPSplit]:
    """The TP splits of the sweep that parse and split the model's KV heads."""
    splits = []
    for text in bench.tp_splits:
        try:
            split = TPSplit.parse(text)
        except ValueError as exc:
            fix = "'P->D' with D TP a multiple of P TP, quoted: 'bench.tp_splits=[\"1->2\"]'"
            out.append(BenchProblem("bench.tp_splits", text, str(exc), fix))
            continue
        try:
            rank_heads(shape.num_kv_heads, split.p_tp, 0)
            rank_heads(shape.num_kv_heads, split.d_tp, 0)
        except ValueError as exc:
            fix = f"TP sizes that split the model's {shape.num_kv_heads} KV heads"
            out.append(BenchProblem("bench.tp_splits", text, str(exc), fix))
            continue
        splits.append(split)
    return splits


def bench_problems(bench: TransferBenchConfig, shape: KVShape) -> list[BenchProblem]:
    """Every setting of ``bench`` the sweep cannot run with this KV shape (pure)."""
    out: list[BenchProblem] = []
    splits = _splits(bench, shape, out)
    for name in ("tokens", "layouts", "tp_splits", "ops", "descs_per_block", "ucx_tls"):
        if not getattr(bench, name):
            out.append(BenchProblem(f"bench.{name}", [], "is empty", "give at least one value"))
    for t in bench.tokens:
        if t < 1:
            out.append(BenchProblem("bench.tokens", t, "is not >= 1", "token counts of 1 or more"))
    for n in bench.descs_per_block:
        if n < 1:
            out.append(BenchProblem("bench.descs_per_block", n, "is not >= 1", "1 or more"))
    if bench.iterations < 1:
        fix = "1 or more timed transfers per case (the preset: 10)"
        out.append(BenchProblem("bench.iterations", bench.iterations, "is not >= 1", fix))
    if bench.warmup < 0:
        out.append(BenchProblem("bench.warmup", bench.warmup, "is negative", "0 or more"))
    if out:
        return out
    seen = set()
    for layout, split, dpb in itertools.product(bench.layouts, splits, bench.descs_per_block):
        if (layout, split, dpb) not in seen:
            seen.add((layout, split, dpb))
            out += _alignment_problems(shape, layout, split, dpb)
    return out


def plan_bench(
    bench: TransferBenchConfig,
    *,
    model: str,
    dtype: str,
    shape: KVShape,
    backends: list[str],
    expected_gb_s: float = 0.0,
    env: dict[str, str] | None = None,
) -> BenchSpec:
    """The sweep as a ``BenchSpec``; raises ``ValueError`` listing every problem found
    (``bench_problems``: validation reports the same ones before anything starts)."""
    problems = bench_problems(bench, shape)
    if problems:
        raise ValueError("transfer bench config:\n  " + "\n  ".join(map(str, problems)))
    if bench.memory is MemoryKind.auto:  # a run config resolves it (it knows the cluster)
        bench = replace(bench, memory=MemoryKind.DRAM)
    splits = [TPSplit.parse(text) for text in bench.tp_splits]
    variants = list(dict.fromkeys(bench.ucx_tls))
    cases: list[BenchCase] = []
    axes = itertools.product(
        variants, bench.ops, bench.layouts, splits, bench.descs_per_block, bench.tokens
    )
    for tls, op, layout, split, dpb, tokens in axes:
        ident = case_identity(
            model,
            dtype,
            shape,
            bench.memory,
            tuple(backends),
            bench.block_order,
            tls,
            layout,
            split,
            tokens,
            op,
            dpb,
            bench.merge_descriptors,
        )
        cases.append(
            BenchCase(
                index=len(cases),
                record_id=record_id(ident),
                ucx_tls=tls,
                layout=layout,
                split=split,
                tokens=tokens,
                blocks=shape.blocks_for(tokens),
                op=op,
                descs_per_block=dpb,
            )
        )
    return BenchSpec(
        model=model,
        dtype=dtype,
        shape=shape,
        memory=bench.memory,
        backends=tuple(backends),
        block_order=bench.block_order,
        iterations=bench.iterations,
        warmup=bench.warmup,
        memcpy_iterations=max(1, bench.memcpy_iterations),
        flag_ratio=bench.flag_ratio,
        flag_min_bytes=bench.flag_min_bytes,
        expected_gb_s=expected_gb_s,
        rendezvous_timeout_s=bench.rendezvous_timeout_s,
        step_timeout_s=bench.step_timeout_s,
        seed=bench.seed,
        cases=tuple(cases),
        progress_thread=bench.progress_thread,
        memcpy_min_bytes=bench.memcpy_min_bytes,
        merge_descriptors=bench.merge_descriptors,
        env=dict(env or {}),
    )


def _alignment_problems(
    shape: KVShape, layout: KVLayout, split: TPSplit, descs_per_block: int
) -> list[BenchProblem]:
    """Descriptors must cut whole int32 words (the integrity pattern) and divide evenly."""
    name, where = "bench.descs_per_block", f"({layout.value}, {split})"
    try:
        xfer = block_transfer(
            shape,
            layout,
            split,
            split.ratio - 1,  # the timed D rank (BenchCase.timed_d_rank)
            [0],
            [0],
            d_num_blocks=1,
            p_num_blocks=1,
            descs_per_block=descs_per_block,
        )
    except ValueError as exc:
        return [BenchProblem(name, descs_per_block, f"{where}: {exc}", "fewer per block")]
    if any(off % WORD_BYTES or n % WORD_BYTES for off, n, _ in xfer.local + xfer.remote):
        return [
            BenchProblem(
                name,
                descs_per_block,
                f"{where}: descriptors of {xfer.local[0][1]} bytes are not whole "
                f"{WORD_BYTES}-byte words",
                "fewer descriptors per block",
            )
        ]
    return []


def pending_cases(spec: BenchSpec, done: set[str]) -> BenchSpec:
    """The spec without the cases whose record ids are in ``done`` (resume)."""

    left = tuple(c for c in spec.cases if c.record_id not in done)
    return replace(spec, cases=left)
