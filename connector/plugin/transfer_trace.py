"""Per-transfer tracing of a NIXL agent: one JSON line per completed transfer.

``TracingNixlWrapper`` stands in for the ``nixl_agent`` a vLLM NIXL worker holds
(``worker.nixl_wrapper``) and forwards every call to it; it watches the four calls a
transfer's life goes through in vLLM 0.32's workers (``pull_worker._read_blocks``,
``push_worker._xfer_blocks``, ``base_worker._pop_done_transfers``):

``make_prepped_xfer`` (descriptors, notification) -> ``transfer`` (post time) ->
``check_xfer_state`` returning ``DONE``/``ERR`` (completion: one line is written, with
NIXL's own telemetry) -> ``release_xfer_handle``.

Trace line fields (``records.trace.TransferTraceRecord``, ``schema_version`` 1):

=================  ================================================================
request_id         the local request whose transfer this was ("" if not found)
remote_request_id  the peer's request id from vLLM's notification (``<id>:<consumers>``)
role               ``prefill`` | ``decode`` | ``unknown`` (no role given) of the writer
op, direction      ``READ`` (``D<-P``: D pulls; ``P<-D``: P pulls history back) |
                   ``WRITE`` (``P->D`` push)
engine_id, tp_rank this worker
tokens, blocks     blocks moved (descriptors / descriptors per block) and the tokens
                   they hold (blocks x block size: whole blocks move)
bytes              NIXL telemetry ``totalBytes`` (-1: telemetry off)
descriptors        descriptors vLLM posted; ``nixl_desc_count`` NIXL's count after merging
post_time          unix time of the post
transfer_s         post to the first ``DONE`` vLLM observed (its polling cadence included)
nixl_xfer_s        NIXL telemetry: post to completion as NIXL measured it (-1: none)
nixl_post_s        NIXL telemetry: time spent in the post call itself
backend            NIXL backend that ran it; ``status`` ``ok`` | ``failed``
=================  ================================================================

No vLLM import here (the plugin class lives in ``connector.plugin.tracing``), so all of this is
testable against a fake agent and a stand-in worker.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from connector.process_env import ROLE_ENV, TRACE_DIR_ENV
from records.trace import TransferTraceRecord


def direction(role: str, op: str) -> str:
    """``D<-P`` for a decode instance's READ, ``P<-D`` for a prefill's, ``P->D`` for a push."""
    me = {"prefill": "P", "decode": "D"}.get(role, "?")
    other = {"P": "D", "D": "P"}.get(me, "?")
    return f"{me}<-{other}" if op == "READ" else f"{me}->{other}"


class JsonLines:
    """Appends JSON lines to one file, opened on first write; safe across threads."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = None

    def __call__(self, row: dict[str, Any]) -> None:
        line = json.dumps(row, default=str) + "\n"
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - kept open
            self._file.write(line)
            self._file.flush()


@dataclass
class _Pending:
    op: str
    descriptors: int
    notif: str
    post_time: float = 0.0
    posted_at: float = 0.0


@dataclass
class TraceContext:
    """What the tracer asks the worker about, read when a transfer completes."""

    role: str
    engine_id: str
    tp_rank: int
    block_size: Callable[[], int]
    descs_per_block: Callable[[], int]
    request_of: Callable[[Any], str]


class TransferTracer:
    """Turns the wrapper's observations into trace lines."""

    def __init__(
        self,
        write: Callable[[dict[str, Any]], None],
        ctx: TraceContext,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.write = write
        self.ctx = ctx
        self.clock = clock
        self.wall = wall
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()

    def made(self, handle: Any, op: str, descriptors: int, notif: bytes | str) -> None:
        text = notif.decode(errors="replace") if isinstance(notif, bytes) else str(notif)
        with self._lock:
            self._pending[id(handle)] = _Pending(op, descriptors, text)

    def posted(self, handle: Any) -> None:
        with self._lock:
            entry = self._pending.get(id(handle))
            if entry is not None:
                entry.post_time, entry.posted_at = self.wall(), self.clock()

    def state(
        self, handle: Any, state: str, telemetry: Callable[[], Any], backend: Callable[[], str]
    ) -> None:
        if state not in ("DONE", "ERR"):
            return
        done_at = self.clock()
        with self._lock:
            entry = self._pending.pop(id(handle), None)
        if entry is None or not entry.posted_at:
            return
        tel = _safe(telemetry)
        per_block = max(1, _safe(self.ctx.descs_per_block) or 1)
        blocks = entry.descriptors // per_block
        record = TransferTraceRecord(
            request_id=_safe(lambda: self.ctx.request_of(handle)) or "",
            remote_request_id=entry.notif.rsplit(":", 1)[0] if entry.notif else "",
            role=self.ctx.role,
            op=entry.op,
            direction=direction(self.ctx.role, entry.op),
            engine_id=self.ctx.engine_id,
            tp_rank=self.ctx.tp_rank,
            tokens=blocks * int(_safe(self.ctx.block_size) or 0),
            blocks=blocks,
            bytes=int(getattr(tel, "totalBytes", -1)),
            descriptors=entry.descriptors,
            nixl_desc_count=int(getattr(tel, "descCount", -1)),
            post_time=entry.post_time,
            transfer_s=done_at - entry.posted_at,
            nixl_xfer_s=_us(getattr(tel, "xferDuration", None)),
            nixl_post_s=_us(getattr(tel, "postDuration", None)),
            backend=_safe(backend) or "",
            status="ok" if state == "DONE" else "failed",
        )
        self.write(asdict(record))

    def released(self, handle: Any) -> None:
        with self._lock:
            self._pending.pop(id(handle), None)


def _us(value: Any) -> float:
    return float(value) / 1e6 if value is not None else -1.0


def _safe(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None if it raises: tracing must never break a transfer."""
    try:
        return fn()
    except Exception:
        return None


class TracingNixlWrapper:
    """A ``nixl_agent`` look-alike that reports transfers to a ``TransferTracer``."""

    def __init__(self, inner: Any, tracer: TransferTracer) -> None:
        self._inner = inner
        self._tracer = tracer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def make_prepped_xfer(
        self, operation, local_xfer_side, local_indices, remote_xfer_side, remote_indices,
        notif_msg=b"", *args, **kwargs,
    ):  # fmt: skip
        handle = self._inner.make_prepped_xfer(
            operation, local_xfer_side, local_indices, remote_xfer_side, remote_indices,
            notif_msg, *args, **kwargs,
        )  # fmt: skip
        _safe(lambda: self._tracer.made(handle, str(operation), len(local_indices), notif_msg))
        return handle

    def transfer(self, handle, *args, **kwargs):
        _safe(lambda: self._tracer.posted(handle))
        return self._inner.transfer(handle, *args, **kwargs)

    def check_xfer_state(self, handle):
        state = self._inner.check_xfer_state(handle)
        _safe(
            lambda: self._tracer.state(
                handle,
                state,
                lambda: self._inner.get_xfer_telemetry(handle),
                lambda: self._inner.query_xfer_backend(handle),
            )
        )
        return state

    def release_xfer_handle(self, handle, *args, **kwargs):
        _safe(lambda: self._tracer.released(handle))
        return self._inner.release_xfer_handle(handle, *args, **kwargs)


def trace_file(trace_dir: str | Path, role: str, engine_id: str, tp_rank: int) -> Path:
    """``<dir>/<role>-<engine>-tp<rank>-<pid>.jsonl``: one writer per file."""
    return Path(trace_dir) / f"{role}-{engine_id}-tp{tp_rank}-{os.getpid()}.jsonl"


_KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode"}


def _extra(vllm_config) -> dict[str, Any]:
    config = getattr(vllm_config, "kv_transfer_config", None)
    return dict(getattr(config, "kv_connector_extra_config", None) or {})


def trace_settings(vllm_config, environ=None) -> tuple[str, str]:
    """(trace dir, role) for this instance; an empty dir means tracing is off."""
    environ = os.environ if environ is None else environ
    extra = _extra(vllm_config)
    trace_dir = environ.get(TRACE_DIR_ENV) or str(extra.get("pdbench_trace_dir") or "")
    kv_role = str(getattr(vllm_config.kv_transfer_config, "kv_role", "") or "")
    role = environ.get(ROLE_ENV) or str(extra.get("pdbench_role") or "")
    return trace_dir, role or _KV_ROLES.get(kv_role, "unknown")


def _request_of(worker) -> Any:
    """Find the request whose outstanding handles include ``handle`` (read at completion)."""

    def find(handle) -> str:
        for name in ("_recving_transfers", "_sending_transfers"):
            for req_id, handles in list(getattr(worker, name, {}).items()):
                if any(h is handle for h in handles):
                    return str(req_id)
        return ""

    return find


def _descs_per_block(worker) -> int:
    """Descriptors vLLM builds per block: one per transferred KV region (layer)."""
    regions = getattr(worker, "_transfer_layer_region_indices", ()) or ()
    return len(regions) or int(getattr(worker, "num_regions", 0) or 1)


def install_tracer(worker, trace_dir: str, role: str, engine_id: str) -> TransferTracer:
    """Wrap ``worker.nixl_wrapper`` so that every completed transfer is traced."""
    tp_rank = int(getattr(worker, "tp_rank", 0))
    ctx = TraceContext(
        role=role,
        engine_id=str(engine_id),
        tp_rank=tp_rank,
        block_size=lambda: int(worker.block_size),
        descs_per_block=lambda: _descs_per_block(worker),
        request_of=_request_of(worker),
    )
    tracer = TransferTracer(JsonLines(trace_file(trace_dir, role, engine_id, tp_rank)), ctx)
    worker.nixl_wrapper = TracingNixlWrapper(worker.nixl_wrapper, tracer)
    return tracer
