"""TTFT in parts: where a turn's time to first token goes (pure, but for reading the files).

Parts (ms), which add up to the client's TTFT exactly, ``residual_ms`` closing the sum:

==================  =======================================================================
router_ms           the router: request received -> its first upstream request sent
p_queue_ms          P: accepted by its API server -> blocks allocated (its queue)
p_pull_ms           P: blocks allocated -> first scheduled after its pull of the history
                    from D arrived (``pull`` flow; 0 when P computes everything)
p_compute_ms        P: first scheduled -> the forward that computes its last prompt token
                    is done
handoff_ms          the router's gap between P's answer and D's request, then D: accepted
                    -> first scheduled, after its read of P's KV (D's queue and KV load)
d_first_step_ms     D: first scheduled -> the forward that gives the first token is done
                    (agg and D alone: accepted -> that forward, the instance's queue included)
residual_ms         TTFT minus the parts above
==================  =======================================================================

Where they come from (``split_source``):

- ``per_request``: the router's spans of the turn (``router_spans_ms``, its own clock) and
  each server's per-request timing lines (``connector.plugin.request_timing``: the plugin's
  scheduler and worker hooks, joined by the router's request id). The residual is then
  measured too, in ``ttft_residual_ms``: ``client_ms`` (client <-> router and the relay
  of the first chunk), ``p_http_ms`` (P's answer outside its engine: HTTP, API server,
  sampling and output processing) and ``d_http_ms`` (the same for D's first chunk).
- ``per_wave_histogram``: where a server left no line (an agg instance runs without the
  connector), vLLM's own histograms over the wave stand in, as means over its requests:
  ``vllm:request_queue_time_seconds`` (P's queue, which holds its pull; the pull is P's
  ``vllm:nixl_xfer_time_seconds`` per request) and ``vllm:request_prefill_time_seconds``
  (compute, sampling included); the router's parts stay per request.

The router's and each server's clocks are used only for differences within themselves, so
this holds across nodes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from connector.plugin.request_timing import external_id
from jobs.measure.metrics import pooled_mean_s, pooled_total
from records.point import TTFT_SPLIT_PARTS, RequestRecord

PARTS = TTFT_SPLIT_PARTS
PER_REQUEST = "per_request"
PER_WAVE = "per_wave_histogram"

QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
XFER = "vllm:nixl_xfer_time_seconds"


@dataclass(frozen=True)
class ServerTiming:
    """One request on one server (seconds on that server's clock; -1: did not happen)."""

    arrival_s: float
    scheduled_s: float
    first_token_s: float  # the forward of the step that computes its last prompt token ended
    load_s: float = -1.0

    @property
    def queue_ms(self) -> float:
        start = self.load_s if self.load_s >= 0 else self.scheduled_s
        return (start - self.arrival_s) * 1e3

    @property
    def load_ms(self) -> float:
        return (self.scheduled_s - self.load_s) * 1e3 if self.load_s >= 0 else 0.0

    @property
    def compute_ms(self) -> float:
        return (self.first_token_s - self.scheduled_s) * 1e3

    @property
    def waiting_ms(self) -> float:
        """Accepted -> first scheduled: the queue and any KV load."""
        return (self.scheduled_s - self.arrival_s) * 1e3

    @property
    def engine_ms(self) -> float:
        return (self.first_token_s - self.arrival_s) * 1e3


@dataclass(frozen=True)
class WaveTiming:
    """Means over one wave's requests from vLLM's histograms (seconds; None: no requests
    counted there). ``d_*`` are the instance that streamed the answer (D, or agg's)."""

    p_queue_s: float | None = None
    p_prefill_s: float | None = None
    p_xfer_s: float | None = None
    d_queue_s: float | None = None
    d_prefill_s: float | None = None

    @classmethod
    def from_deltas(
        cls,
        deltas: dict[str, dict[str, float]],
        prefill_names: Iterable[str],
        answer_names: Iterable[str],
    ) -> WaveTiming:
        prefill, answer = list(prefill_names), list(answer_names)
        p_requests = pooled_total(deltas, prefill, f"{QUEUE}_count")
        return cls(
            p_queue_s=pooled_mean_s(deltas, prefill, QUEUE),
            p_prefill_s=pooled_mean_s(deltas, prefill, PREFILL),
            p_xfer_s=pooled_total(deltas, prefill, f"{XFER}_sum") / p_requests
            if p_requests
            else None,
            d_queue_s=pooled_mean_s(deltas, answer, QUEUE),
            d_prefill_s=pooled_mean_s(deltas, answer, PREFILL),
        )


def _close(parts: dict[str, float], ttft_ms: float) -> dict[str, float]:
    """Every part, in ``PARTS`` order, the residual closing the sum at ``ttft_ms``."""
    out = {k: parts.get(k, 0.0) for k in PARTS if k != "residual_ms"}
    out["residual_ms"] = ttft_ms - sum(out.values())
    return out


def split_per_request(
    record: RequestRecord, p: ServerTiming | None, d: ServerTiming | None
) -> tuple[dict[str, float], dict[str, float]] | None:
    """(parts, the residual's parts) of one request from the router's spans and the servers'
    lines; None when a server the turn went through left no line."""
    spans = record.router_spans_ms
    has_p = spans.get("p", 0.0) > 0
    if d is None or not spans or (has_p and p is None):
        return None
    parts = {"router_ms": spans.get("route", 0.0)}
    residual = {
        "client_ms": record.ttft_ms - sum(spans.get(k, 0.0) for k in ("route", "p", "gap", "d"))
    }
    if has_p:
        parts.update(
            p_queue_ms=p.queue_ms,
            p_pull_ms=p.load_ms,
            p_compute_ms=p.compute_ms,
            handoff_ms=spans.get("gap", 0.0) + d.waiting_ms,
            d_first_step_ms=d.compute_ms,
        )
        residual["p_http_ms"] = spans["p"] - p.engine_ms
    else:
        parts["d_first_step_ms"] = d.engine_ms
    residual["d_http_ms"] = spans.get("d", 0.0) - d.engine_ms
    return _close(parts, record.ttft_ms), residual


def split_per_wave(record: RequestRecord, wave: WaveTiming) -> dict[str, float] | None:
    """The parts of one request with the servers' parts as means over its wave (vLLM's
    histograms); None without the router's spans or the answering instance's means."""
    spans = record.router_spans_ms
    if not spans or wave.d_queue_s is None or wave.d_prefill_s is None:
        return None
    parts = {"router_ms": spans.get("route", 0.0)}
    if spans.get("p", 0.0) > 0:
        if wave.p_queue_s is None or wave.p_prefill_s is None:
            return None
        pull_s = wave.p_xfer_s or 0.0
        parts.update(
            p_queue_ms=(wave.p_queue_s - pull_s) * 1e3,
            p_pull_ms=pull_s * 1e3,
            p_compute_ms=wave.p_prefill_s * 1e3,
            handoff_ms=spans.get("gap", 0.0) + wave.d_queue_s * 1e3,
            d_first_step_ms=wave.d_prefill_s * 1e3,
        )
    else:
        parts["d_first_step_ms"] = (wave.d_queue_s + wave.d_prefill_s) * 1e3
    return _close(parts, record.ttft_ms)


def wanted_ids(records: list[RequestRecord]) -> set[str]:
    """The server-side ids of these requests (P's, D's, and agg's own)."""
    return {
        f"{r.request_id}{suffix}" for r in records if r.request_id for suffix in ("", "-p", "-d")
    }


def apply(
    records: list[RequestRecord],
    servers: dict[str, ServerTiming],
    waves: dict[int, WaveTiming],
) -> None:
    """Fill ``ttft_split``, ``split_source`` and ``ttft_residual_ms`` of every answered
    request: per request where both servers' lines are there, else per wave."""
    for r in records:
        if r.status != "ok":
            continue
        rid = r.request_id
        p, d = (
            (servers.get(f"{rid}-p"), servers.get(f"{rid}-d") or servers.get(rid))
            if rid
            else (None, None)
        )
        got = split_per_request(r, p, d)
        if got is not None:
            r.ttft_split, r.ttft_residual_ms = got
            r.split_source = PER_REQUEST
            continue
        wave = waves.get(r.turn)
        parts = split_per_wave(r, wave) if wave is not None else None
        if parts is not None:
            r.ttft_split, r.split_source = parts, PER_WAVE
            spans = r.router_spans_ms
            r.ttft_residual_ms = {
                "client_ms": r.ttft_ms - sum(spans.get(k, 0.0) for k in ("route", "p", "gap", "d"))
            }


def read_server_timing(
    timing_dir: str | Path, wanted: set[str] | None = None
) -> dict[str, ServerTiming]:
    """Every instance's timing lines under ``timing_dir/<instance>/`` (``connector.
    request_timing``), by the router's request id; ``wanted``: only those ids. A request
    whose step has no worker line yet (or a torn line) is left out."""
    out: dict[str, ServerTiming] = {}
    for instance in sorted(p for p in Path(timing_dir).glob("*") if p.is_dir()):
        ends: dict[int, float] = {}
        for path in instance.glob("worker*.jsonl"):
            for row in _lines(path):
                step, end = row.get("step"), row.get("forward_end_s")
                if isinstance(step, int) and isinstance(end, int | float):
                    ends[step] = max(ends.get(step, end), end)  # TP ranks: the last one
        for path in instance.glob("sched-*.jsonl"):
            for row in _lines(path):
                rid = external_id(str(row.get("request_id", "")))
                if (wanted is not None and rid not in wanted) or row.get("step") not in ends:
                    continue
                try:
                    out[rid] = ServerTiming(
                        arrival_s=float(row["arrival_s"]),
                        scheduled_s=float(row["scheduled_s"]),
                        first_token_s=ends[row["step"]],
                        load_s=float(row.get("load_s", -1.0)),
                    )
                except (KeyError, TypeError, ValueError):
                    continue
    return out


def _lines(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if isinstance(row, dict):
            rows.append(row)
    return rows
