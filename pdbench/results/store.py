"""The results store: run manifest, one PointResult file per Point, raw request records.

Layout of a run directory::

    <run.dir>/manifest.json                 composed config + provenance
    <run.dir>/points/<point_id>.json        one PointResult, written atomically
    <run.dir>/requests/<point_id>.jsonl     one RequestRecord per line
    <run.dir>/logs/<deployment_id>/...      server, router and job logs
    <run.dir>/launch/<deployment_id>.json   the launch spec the job ran (pdbench.spec.launch)
    <run.dir>/traces/<deployment_id>/*.jsonl  per-transfer traces (connector.trace=true)
    <run.dir>/preflight/<deployment_id>.json  every node's preflight report (jobs/preflight/job.py)

Every write goes to a temporary file in the same directory and is renamed into place, so
a crash leaves the old file or the new one, never a torn one. Analysis reads only these.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from connector.shared_files import write_json_atomic, write_lines_atomic

__all__ = ["write_json_atomic", "write_lines_atomic"]  # with the store: writers of run files

SCHEMA_VERSION = 1

# Run dirs this process launches into, with their open lock files (held until it exits).
_CLAIMED: dict[str, Any] = {}


class PointStatus(StrEnum):
    """A Point's state in a run dir; the JSON records hold the value ("ok", ...)."""

    ok = "ok"  # measured, every request answered
    failed = "failed"  # measured or attempted, something failed (the record says what)
    pending = "pending"  # no record yet (never written to a record)
    corrupt = "corrupt"  # a record that does not parse (never written as such): measured again


# The parts of a request's TTFT (``RequestRecord.ttft_split``, jobs/measure/ttft_split.py): the
# router, then P (its queue, its compute, and its pull from D, which comes before P's
# compute), the hand-off to D and D's first step; the residual closes the sum at the
# measured TTFT. The order is the records' and the report's columns.
TTFT_SPLIT_PARTS = (
    "router_ms",
    "p_queue_ms",
    "p_compute_ms",
    "p_pull_ms",
    "handoff_ms",
    "d_first_step_ms",
    "residual_ms",
)


@dataclass
class RequestRecord:
    """One request as the load generator saw it (client-side clock)."""

    conversation: int
    turn: int  # 1-based
    flow: str
    prompt_tokens: int
    history_tokens: int  # prompt tokens before this turn's user message
    output_token_ids: list[int]
    ttft_ms: float
    itl_ms: list[float]
    e2e_ms: float  # request sent -> last token arrived (-> failure, if it failed)
    start_s: float  # seconds since the Point started
    status: str = "ok"  # ok | failed
    error: str = ""
    request_id: str = ""  # the router's id of the turn: P's vLLM request <id>-p, D's <id>-d
    # The router's clock over the turn (ms; jobs.serving.router.TurnTiming): route, p, gap, d
    router_spans_ms: dict[str, float] = field(default_factory=dict)
    # TTFT in parts (ms; jobs/measure/ttft_split.py): router_ms, p_queue_ms, p_compute_ms,
    # p_pull_ms, handoff_ms, d_first_step_ms and residual_ms (TTFT minus the others); a part
    # the route does not have is 0. {} when nothing could be split (failed request).
    ttft_split: dict[str, float] = field(default_factory=dict)
    split_source: str = (
        ""  # "per_request" | "per_wave_histogram" (ttft_split.PER_REQUEST, PER_WAVE)
    )
    # The residual's own parts where measured (ms): client_ms (client <-> router and the
    # relay), p_http_ms (P's answer outside its engine), d_http_ms (D's, to its first chunk)
    ttft_residual_ms: dict[str, float] = field(default_factory=dict)
    path: str = ""  # the router's route for this turn (e.g. "pull", "recompute", "agg")
    cached_tokens: int = -1  # the server's prompt_tokens_details.cached_tokens, -1: absent
    prefill_ms: float = -1.0  # P's share of TTFT as the router saw it, -1: P not asked
    # Tokens per chunk, the first chunk included (a chunk: the tokens one read from the
    # socket brought); ``itl_ms`` holds the gaps between consecutive chunks, one per chunk
    # after the first, so len(chunk_tokens) == len(itl_ms) + 1 and no ITL is 0.
    chunk_tokens: list[int] = field(default_factory=list)
    # (e2e_ms - ttft_ms) / (tokens - 1), 0 with one token or none: vllm bench serve's TPOT.
    tpot_ms: float = 0.0
    # How the client edited the history before this turn (jobs.history): "" none,
    # strip_reply, change_message; such a turn must be recomputed, never pulled.
    history_edit: str = ""
    # Open-loop arrivals (workload.arrival poisson|gamma): when the schedule offered this turn,
    # seconds since the Point started (start_s - offered_s: how late it went out); -1: waves.
    offered_s: float = -1.0


@dataclass
class LatencyStats:
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    mean: float = 0.0


@dataclass
class Summary:
    ttft_ms: LatencyStats = field(default_factory=LatencyStats)
    itl_ms: LatencyStats = field(default_factory=LatencyStats)  # over gaps between chunks
    e2e_ms: LatencyStats = field(default_factory=LatencyStats)
    requests: int = 0
    failed_requests: int = 0
    output_tokens: int = 0
    duration_s: float = 0.0
    throughput_tok_s: float = 0.0
    tpot_ms: LatencyStats = field(default_factory=LatencyStats)  # over requests of 2+ tokens
    tokens_per_chunk_mean: float = 0.0  # output tokens / chunks, ok requests


@dataclass
class TurnRow:
    """Server-side attribution of one turn index, across conversations."""

    turn: int
    requests: int
    history_tokens_mean: float
    prompt_tokens_mean: float
    ttft_ms_p50: float
    ttft_ms_mean: float
    prefill_tokens_computed: float  # prompt tokens P (or the agg instance) computed
    prefix_hit_tokens: float  # prompt tokens served from the local prefix cache
    tokens_pulled: float  # prompt tokens whose KV came from the other instance
    bytes_pulled: float  # NIXL bytes moved during this turn, all instances
    paths: dict[str, int] = field(default_factory=dict)
    # P's share of TTFT (router clock; -1: P not asked): TTFT minus this is D's share.
    prefill_ms_p50: float = -1.0
    # NIXL transfers read during this turn, per instance: {"bytes", "seconds", "count"}
    # (vllm:nixl_* as the reader counts them: a prefill instance's are P<-D pulls of the
    # history, a decode instance's D<-P reads of P's prefill)
    nixl: dict[str, dict[str, float]] = field(default_factory=dict)
    # Mean TTFT parts of the turn's answered requests (ms; RequestRecord.ttft_split), and
    # how many of them were split per request / per wave
    ttft_split_mean: dict[str, float] = field(default_factory=dict)
    split_sources: dict[str, int] = field(default_factory=dict)


@dataclass
class TransferTotals:
    bytes: float = 0.0
    seconds: float = 0.0
    count: float = 0.0
    failed: float = 0.0  # transfers NIXL reported failed (recomputed or failed per policy)
    read_after_expiry: float = 0.0  # reads of blocks whose lease had already run out


@dataclass
class DecodeBill:
    """What a Point cost the decode instances (``jobs.measure.decode_bill``): KV held over time
    (sampled, and per request from the records) and D's own per-token latency."""

    blocks: int = 0  # KV blocks of the decode instances together (vLLM's num_gpu_blocks)
    ttl_s: float = 0.0  # decoder_kv_blocks_ttl of the deployment
    load_s: float = 0.0  # seconds the Point's load ran (samples after it are the tail)
    usage_peak: float = 0.0  # highest sampled occupancy, 0..1
    usage_mean: float = 0.0  # mean sampled occupancy while the load ran, 0..1
    block_s: float = 0.0  # block-seconds above the starting level, load and tail (sampled)
    tail_block_s: float = 0.0  # the part of block_s after the load: held by the TTL alone
    tail_s: float = -1.0  # load end -> back at the starting level; -1: not seen (no tail)
    # the last request D decoded ended -> D back at its starting level: how long D held
    # what it kept last (about the TTL when nobody pulled it); -1: not seen
    release_s: float = -1.0
    pulled_requests: int = 0  # D's kept blocks that P pulled next turn (records)
    pulled_block_s: float = 0.0  # their blocks x (request end -> P's prefill ended)
    never_pulled_requests: int = 0  # kept blocks nobody read: held for the TTL
    never_pulled_block_s: float = 0.0  # their blocks x TTL
    # D's leases that ran out (vllm:nixl_num_kv_expired_reqs): from the first to the last KV
    # sample, the TTL's tail included; the between-wave counter delta without samples
    expired_leases: float = 0.0
    itl_ms_server: float = 0.0  # D's vllm:inter_token_latency_seconds mean, ms
    tpot_ms_server: float = 0.0  # D's vllm:request_time_per_output_token_seconds mean, ms


@dataclass
class PointResult:
    point_id: str
    status: PointStatus  # ok | failed
    error: str
    flow: str
    deployment: dict[str, Any]
    workload: dict[str, Any]  # its ``repetition`` and ``history_tokens`` included
    repetition: int = 0  # 0-based: independent Points of one (deployment, flow, history)
    order_index: int = -1  # its place in its Deployment's run order (pdbench/plan/points.py)
    summary: Summary = field(default_factory=Summary)
    by_turn: list[TurnRow] = field(default_factory=list)
    transfer: TransferTotals = field(default_factory=TransferTotals)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # instance -> deltas
    requests_file: str = ""
    trace_files: list[str] = field(default_factory=list)
    # UCX transports that carried remote reads/writes, per instance (from UCX_PROTO_INFO)
    transport_used: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)  # warnings a reader must not miss
    router: dict[str, Any] = field(default_factory=dict)  # routes, retries, expired leases
    decode_bill: DecodeBill = field(default_factory=DecodeBill)
    # instance -> [[t_s, kv usage 0..1, requests running, expired leases so far], ...]
    # every flow.kv_sample_period_s during the Point (and its tail: flow.kv_tail)
    kv_timeline: dict[str, list[list[float]]] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)  # instance -> "hostname (address)"
    # The Deployment's launch spec as the job ran it (commands, env, addresses), run-relative
    launch_spec_file: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    # open-loop arrivals: offered_rate, achieved_rate (turns/s), late_share, lateness_p90_ms,
    # kept_up (pdbench.plan.arrivals.OfferedLoad); {} for closed-loop waves
    offered_load: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    job_id: str = ""  # the job that measured it (SLURM id, or the local process id)
    attempt: int = 0  # its SLURM_RESTART_COUNT: 1 and up in a requeued job

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CorruptRecord(ValueError):
    """A record file that is not the JSON object it should be (truncated, overwritten)."""

    def __init__(self, path: Path, reason: str):
        self.path = path
        super().__init__(f"{path}: corrupt record ({reason})")


def read_record(path: Path) -> dict[str, Any]:
    """One JSON record file; ``CorruptRecord`` naming the file when it does not parse."""
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptRecord(path, str(err)) from err
    if not isinstance(record, dict):
        raise CorruptRecord(path, f"a JSON {type(record).__name__}, not an object")
    return record


# What a run writes under its dir (besides manifest.json): where nothing else may write
# (``python -m analysis --out`` is refused there: its files would be read back as records)
RUN_FOLDERS = frozenset(
    {
        "points",
        "requests",
        "logs",
        "launch",
        "traces",
        "timing",
        "warmup",
        "search",
        "serve",
        "submitit",
        "rendezvous",
        "transfer_bench",
        "preflight",
    }
)


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    @property
    def points_dir(self) -> Path:
        return self.root / "points"

    def point_path(self, point_id: str) -> Path:
        return self.points_dir / f"{point_id}.json"

    def requests_path(self, point_id: str) -> Path:
        return self.root / "requests" / f"{point_id}.jsonl"

    def logs_dir(self, deployment_id: str) -> Path:
        return self.root / "logs" / deployment_id

    def launch_spec_path(self, deployment_id: str) -> Path:
        """The launch spec a Deployment's job ran, addresses resolved (``launch_spec``)."""
        return self.root / "launch" / f"{deployment_id}.json"

    def traces_dir(self, point_id: str) -> Path:
        return self.root / "traces" / point_id

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        write_json_atomic(self.manifest_path, manifest)

    def read_manifest(self) -> dict[str, Any]:
        return read_record(self.manifest_path)

    def previous_manifest(self, set_aside: bool) -> tuple[dict[str, Any], str]:
        """The dir's manifest (``{}`` for a new dir) and, when it does not parse, what became
        of it: set aside (``set_aside``; the launch then starts a new history, as a corrupt
        Point is measured again) or, for a dry run, what a launch would do with it."""
        if not self.manifest_path.exists():
            return {}, ""
        try:
            return self.read_manifest(), ""
        except CorruptRecord as err:
            if not set_aside:
                return {}, (
                    f"{err}: a launch sets it aside and starts a new history (its launches and "
                    "jobs are lost; its Points recorded ok are still skipped)"
                )
            aside = self.set_aside(self.manifest_path)
            return {}, (
                f"{err}: set aside as {aside.name}; this launch starts a new history (the old "
                "launches and jobs are in that file; Points recorded ok are still skipped)"
            )

    def set_aside(self, path: Path) -> Path:
        """Rename a corrupt record to ``<stem>.corrupt-<time><suffix>`` beside it: kept for
        a reader, out of the way of a new one."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = path.with_name(f"{path.stem}.corrupt-{stamp}{path.suffix}")
        n = 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.stem}.corrupt-{stamp}-{n}{path.suffix}")
        path.rename(aside)
        return aside

    @contextmanager
    def _manifest_lock(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".manifest.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def held_by(self) -> str | None:
        """Who holds the dir's launch lock now (None: nobody), without taking it."""
        path = self.root / ".launch.lock"
        if not path.exists():
            return None
        with open(path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                return lock.read().strip() or "another process"
            fcntl.flock(lock, fcntl.LOCK_UN)
        return None

    def claim(self) -> str | None:
        """Hold the dir's launch lock until this process ends; None once held, else who holds
        it. Two launches following jobs into one dir at once would start servers on the same
        ports and write the same records. The jobs of one ``-m`` sweep run in one process:
        a dir it already holds is its own."""
        key = str(self.root.resolve())
        if key in _CLAIMED:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        lock = open(self.root / ".launch.lock", "a+")  # noqa: SIM115 - held past this call
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            lock.close()
            return holder
        lock.seek(0)
        lock.truncate()
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}, since {since}\n")
        lock.flush()
        _CLAIMED[key] = lock
        return None

    def update_manifest(self, mutate: Callable[[dict[str, Any]], None]) -> str:
        """Read, change and write the manifest under a lock: the driver (jobs it submitted)
        and the jobs (their nodes' preflight findings) both add to it. One that does not
        parse is set aside (``set_aside``) and a new one begun, so that nothing fails on
        it; returns what was set aside ('' when nothing was)."""
        with self._manifest_lock():
            manifest, note = self.previous_manifest(set_aside=True)
            mutate(manifest)
            self.write_manifest(manifest)
        return note

    def write_point(self, result: PointResult, requests: list[RequestRecord]) -> None:
        """Write the request records first, then the PointResult that points at them."""
        req_path = self.requests_path(result.point_id)
        write_lines_atomic(req_path, [asdict(r) for r in requests])
        result.requests_file = str(req_path.relative_to(self.root))
        write_json_atomic(self.point_path(result.point_id), result.to_dict())

    def read_point(self, point_id: str) -> dict[str, Any] | None:
        path = self.point_path(point_id)
        if not path.exists():
            return None
        return read_record(path)

    def has_record(self, point_id: str) -> bool:
        """Whether the Point has a record (ok, failed or corrupt): not ``pending``, without
        reading it (progress counts run every tick)."""
        return self.point_path(point_id).exists()

    def point_status(self, point_id: str) -> PointStatus:
        """``ok``, ``failed``, ``corrupt`` (unreadable: measured again) or ``pending``."""
        try:
            record = self.read_point(point_id)
        except CorruptRecord:
            return PointStatus.corrupt
        if record is None:
            return PointStatus.pending
        return PointStatus.ok if record.get("status") == PointStatus.ok else PointStatus.failed

    def iter_points(self) -> list[dict[str, Any]]:
        if not self.points_dir.exists():
            return []
        return [read_record(p) for p in sorted(self.points_dir.glob("*.json"))]

    def read_requests(self, point_id: str) -> list[dict[str, Any]]:
        path = self.requests_path(point_id)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
