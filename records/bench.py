"""One transfer-bench case: ``transfer_bench/<record_id>.json`` (``connector.bench.runner``
writes it, the analysis and the bench's summary table read it back,
``records.read.bench_record``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from records.versions import BENCH_SCHEMA


@dataclass
class TransferRecord:
    """One transfer-bench case (fields: ``connector/bench_record.py``'s table)."""

    record_id: str
    status: str
    model: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size: int
    layout: str
    tp_split: str
    p_tp: int
    d_tp: int
    d_rank: int
    p_rank: int
    tokens: int
    blocks: int
    bytes: int
    bytes_per_block: int
    descriptors: int
    descs_per_block: int
    merge_descriptors: bool
    op: str
    initiator: str
    memory: str
    block_order: str
    ucx_tls: str
    backend: str = ""
    ucx_transports: list[str] = field(default_factory=list)
    nixl_desc_count: int = -1
    make_xfer_s: float = 0.0
    iterations: int = 0
    warmup: int = 0
    times_s: list[float] = field(default_factory=list)
    median_s: float = 0.0
    p90_s: float = 0.0
    gb_s: float = 0.0
    memcpy_gb_s: float = 0.0
    expected_gb_s: float = 0.0
    integrity_ok: bool = False
    flag: bool = False
    flag_reasons: list[str] = field(default_factory=list)
    host_owner: str = ""
    host_reader: str = ""
    started_at: float = 0.0
    error: str = ""
    schema_version: int = BENCH_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
