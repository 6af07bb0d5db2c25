"""Records of the transfer bench: schema, statistics, flags and the summary table (pure).

One JSON file per case: ``<run_dir>/transfer_bench/<record_id>.json``, written atomically by
the task that posted the transfer. ``record_id`` hashes what the case measures, so a rerun
skips cases already recorded ``ok``. Fields (``TransferRecord``):

=================  =====================================================================
schema_version     1
record_id, status  ``ok`` | ``failed``; ``error`` holds the reason when failed
model, dtype       served model name and KV dtype; ``num_layers num_kv_heads head_dim
                   dtype_bytes block_size`` the shape the descriptors were built from
layout             ``HND`` (head-major pages) | ``NHD`` (token-major pages)
tp_split           ``"P->D"``; ``p_tp d_tp``; ``d_rank`` the D rank timed (reads from P rank
                   ``p_rank``); every D rank of that P rank is integrity-checked
tokens, blocks     tokens moved and the blocks holding them (``ceil(tokens / block_size)``)
bytes              bytes moved by the timed transfer = ``blocks * bytes_per_block``
bytes_per_block    one block, all layers, the D rank's heads (``connector.layout``)
descriptors        descriptors posted per side; ``descs_per_block`` the split of each run;
                   ``nixl_desc_count`` what NIXL reported after merging (telemetry, -1: none);
                   ``merge_descriptors`` false: NIXL was told not to merge (skip_desc_merge)
make_xfer_s        preparing both descriptor lists and the transfer handle (once per case)
op                 ``READ`` (D pulls, posted by the reader) | ``WRITE`` (P pushes, posted by
                   the owner); ``initiator`` ``reader`` | ``owner``
iterations         timed repetitions after ``warmup`` untimed ones; ``times_s`` each
median_s, p90_s    post-to-completion time of one transfer
gb_s               ``bytes / median_s / 1e9``
memcpy_gb_s        a local copy in the same memory (torch ``copy_``, one thread: host memcpy
                   on DRAM, device-to-device on VRAM) of ``max(bytes, memcpy_min_bytes)``
                   bytes, so small sizes measure memory and not cache; median
expected_gb_s      ``transport.expected_gb_s`` (0: unknown)
backend            NIXL backend that ran the transfer (``query_xfer_backend``)
ucx_tls            UCX_TLS the agents ran with (``""``: UCX's own choice)
ucx_transports     UCX transports that carried the data, from ``UCX_PROTO_INFO`` (e.g.
                   ``["cma/memory"]``, ``["rc_mlx5/mlx5_0:1"]``, ``["tcp/eth0"]``); [] unknown
memory             ``DRAM`` | ``VRAM``; ``block_order`` ``scattered`` | ``contiguous``
integrity_ok       the reader found exactly the owner's pattern in every byte moved
flag, flag_reasons true when something is off: ``below_memcpy`` / ``below_expected`` (GB/s
                   under ``flag_ratio`` of either, transfers >= ``flag_min_bytes`` only),
                   ``tcp_data_path`` (TCP carried the data though UCX_TLS did not name
                   ``tcp``: UCX's silent fallback), ``integrity_failed``
host_owner         node of the owner (P) task (SLURMD_NODENAME, else hostname);
                   ``host_reader`` of the reader (D) task
started_at         unix time the case started
=================  =====================================================================
"""

from __future__ import annotations

import math

from connector.ucx_proto import tcp_fallback
from records.bench import TransferRecord


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of ``values`` (``q`` in [0, 1])."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def gb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def flag_reasons(
    *,
    gb_s: float,
    memcpy_gb_s: float,
    expected_gb_s: float,
    nbytes: int,
    ratio: float,
    min_bytes: int,
    transports: list[str],
    ucx_tls: str,
    integrity_ok: bool,
) -> list[str]:
    """Why a measurement looks wrong; empty when it does not."""
    reasons = []
    if not integrity_ok:
        reasons.append("integrity_failed")
    if nbytes >= min_bytes:
        if memcpy_gb_s > 0 and gb_s < ratio * memcpy_gb_s:
            reasons.append("below_memcpy")
        if expected_gb_s > 0 and gb_s < ratio * expected_gb_s:
            reasons.append("below_expected")
    if tcp_fallback(transports, ucx_tls):
        reasons.append("tcp_data_path")
    return reasons


def format_table(records: list[TransferRecord]) -> str:
    """GB/s per token count (columns) for each op, UCX_TLS, layout, split and descs/block.

    A ``!`` marks a flagged cell, ``x`` a failed case; ``memcpy`` is the best local copy seen
    for that row. Blocks, bytes and descriptors of the largest column follow.
    """
    if not records:
        return "(no transfer-bench records)"
    tokens = sorted({r.tokens for r in records})
    rows: dict[tuple, dict[int, TransferRecord]] = {}
    for r in records:
        key = (r.op, r.ucx_tls or "-", r.layout, r.tp_split, r.descs_per_block)
        rows.setdefault(key, {})[r.tokens] = r
    head = ["op", "ucx_tls", "layout", "split", "d/blk"] + [f"{t} tok" for t in tokens]
    head += ["memcpy", "transport", "descs@max"]
    lines = [head]
    for key in sorted(rows):
        cells = rows[key]
        row = [str(k) for k in key]
        for t in tokens:
            r = cells.get(t)
            if r is None:
                row.append("")
            elif r.status != "ok":
                row.append("x")
            else:
                row.append(f"{r.gb_s:.2f}{'!' if r.flag else ''}")
        oks = [r for r in cells.values() if r.status == "ok"]
        memcpy = max((r.memcpy_gb_s for r in oks), default=0.0)
        row.append(f"{memcpy:.2f}" if oks else "")
        transports = sorted({t for r in oks for t in r.ucx_transports})
        backend = next((r.backend for r in oks if r.backend), "")
        row.append(f"{backend}:{'+'.join(transports) or '?'}" if oks else "")
        row.append(str(cells[max(cells)].descriptors))
        lines.append(row)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append("GB/s per transfer (median); ! flagged (see flag_reasons), x failed")
    return "\n".join(out)
