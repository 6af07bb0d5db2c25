"""Which UCX transports actually carried KV: parse ``UCX_PROTO_INFO=y`` tables in server logs.

UCX picks transports silently; between GPUs a fallback to TCP costs ~100x (NIXL #791,
Dynamo #1072). Servers run with ``UCX_PROTO_INFO=y``, which makes UCX print, per endpoint
configuration, a table headed by the operation (e.g. ``remote memory read by ucp_get*``)
whose rows name the transport/device used (``cma/memory``, ``tcp/lo``, ``rc_mlx5/mlx5_0:1``,
``cuda_ipc/cuda``). KV pulls are remote reads, so those tables are the ones that matter.
"""

from __future__ import annotations

from pathlib import Path

from connector.ucx_proto import parse_proto_info

# Transports that mean "no fast path was found" for the memory kind named.
SLOW_FOR = {"cuda": ("tcp",), "cpu": ()}
_OPERATIONS = {"read": "remote memory read", "write": "remote memory write"}


def transports_by_operation(log_text: str) -> dict[str, list[str]]:
    """``{"read": [...], "write": [...]}``: transports UCX chose for remote memory access to
    peers (tables of an endpoint to itself are left out), over every NIXL agent in the log."""
    found: dict[str, set[str]] = {op: set() for op in _OPERATIONS}
    for table in parse_proto_info(log_text):
        if table.scope == "self":
            continue
        for op, prefix in _OPERATIONS.items():
            if table.operation.startswith(prefix):
                found[op].update(table.transports)
    return {op: sorted(v) for op, v in found.items()}


def transports_in_log(path: Path) -> dict[str, list[str]]:
    try:
        return transports_by_operation(path.read_text(errors="replace"))
    except OSError:
        return {"read": [], "write": []}


def slow_transport_flag(kv_buffer_device: str, read_transports: list[str]) -> str:
    """A warning when only slow transports carried reads of this memory kind, else ''."""
    slow = SLOW_FOR.get(kv_buffer_device, ())
    names = {t.split("/")[0] for t in read_transports}
    if names and slow and names <= set(slow):
        return (
            f"KV reads of {kv_buffer_device} memory went over {sorted(names)} only: UCX found "
            "no fast path (check UCX_TLS, GPUDirect RDMA, cuda_ipc)"
        )
    return ""
