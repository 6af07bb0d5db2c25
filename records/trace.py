"""One traced KV transfer (``connector.trace=true``): a line of ``traces/**/*.jsonl``.

Written by ``connector.plugin.transfer_trace`` when a NIXL transfer completes, read back by the
analysis (``records.read.trace_line``). The file a line is in names its Point or its
Deployment (``traces/<point or deployment id>/<role>-<engine>-tp<rank>-<pid>.jsonl``).
"""

from __future__ import annotations

from dataclasses import dataclass

from records.versions import TRACE_SCHEMA


@dataclass
class TransferTraceRecord:
    """Fields as ``connector/plugin/transfer_trace.py``'s table describes them."""

    op: str  # READ | WRITE
    direction: str  # D<-P (D reads the hand-off), P<-D (P pulls the history), P->D (a push)
    post_time: float  # unix time of the post
    transfer_s: float  # post to the first DONE vLLM observed
    request_id: str = ""  # the local request ("" if not found)
    remote_request_id: str = ""  # the peer's, from vLLM's notification
    role: str = ""  # prefill | decode | unknown: the writer's
    engine_id: str = ""
    tp_rank: int = 0
    tokens: int = 0  # blocks x block size (whole blocks move)
    blocks: int = 0
    bytes: int = -1  # NIXL telemetry totalBytes; -1: telemetry off (then from tokens)
    descriptors: int = 0  # posted by vLLM
    nixl_desc_count: int = -1  # after NIXL merged them; -1: no telemetry
    nixl_xfer_s: float = -1.0  # NIXL's own post-to-completion; -1: none
    nixl_post_s: float = -1.0  # time in the post call
    backend: str = ""
    status: str = "ok"  # ok | failed
    schema_version: int = TRACE_SCHEMA
