"""A Point's records: the ``PointResult`` file, its request lines, and what they hold.

Layout in a run dir: ``points/<point_id>.json`` (one ``PointResult``) and
``requests/<point_id>.jsonl`` (one ``RequestRecord`` per line). Written by the job
(``jobs/run/point.py``) from these types, read back into them (``records.read``): a field
renamed here fails the readers' tests instead of turning into a NaN in a report.
``schema_version`` in each (``records.versions``).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import msgspec

from records.model import ModelShape
from records.versions import POINT_SCHEMA, REQUEST_SCHEMA

V = TypeVar("V")


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
    schema_version: int = REQUEST_SCHEMA


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


# Typed views of the config sections a PointResult keeps as composed (``deployment``: the
# Deployment's record, ``pdbench.plan.deployments.Deployment.record``; ``workload``: the
# Point's workload, ``pdbench.plan.points.workload_record``). The record keeps every field;
# a view holds those readers use (others are ignored when read), so that they read
# attributes, never keys, and a renamed field fails here, in one place.


@dataclass
class RoleView:
    count: int = 0
    tp: int = 1


@dataclass
class TopologyView:
    name: str = ""
    prefill: RoleView = field(default_factory=RoleView)
    decode: RoleView = field(default_factory=RoleView)
    agg: RoleView = field(default_factory=RoleView)
    placement: str = ""


@dataclass
class TransportView:
    name: str = ""
    ucx_tls: str = ""


@dataclass
class ServerView:
    block_size: int = 0
    prefill_prefix_caching: bool = False
    prefill_kv_blocks: int = 0


@dataclass
class ModelView:
    """A Point's model section: its name and shape as the run's config held them."""

    name: str = ""
    num_layers: int = 0
    hidden_size: int = 0
    num_attention_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    dtype: str = ""
    tie_word_embeddings: bool = False

    def shape(self) -> ModelShape:
        """The shape (``records.model``); ``ValueError`` names the sizes the record lacks."""
        return ModelShape.from_dict(asdict(self))


@dataclass
class DeploymentView:
    """A Point's Deployment: the servers it ran on."""

    deployment_id: str = ""
    model: ModelView = field(default_factory=ModelView)
    topology: TopologyView = field(default_factory=TopologyView)
    transport: TransportView = field(default_factory=TransportView)
    server: ServerView = field(default_factory=ServerView)
    kv_recompute_threshold: int | None = None
    decoder_kv_blocks_ttl_s: int | None = None


@dataclass
class OfferedLoadView:
    """An open-loop Point's offered load (``pdbench.plan.arrivals.OfferedLoad.record``);
    every field None for closed-loop waves (an empty record)."""

    offered_rate: float | None = None  # turns/s the schedule offered
    achieved_rate: float | None = None  # turns answered per second
    late_share: float | None = None  # turns sent after their slot
    lateness_p90_ms: float | None = None
    kept_up: bool | None = None


@dataclass
class WorkloadView:
    """A Point's workload: its own value of each axis, and what shapes its requests."""

    kind: str = ""
    history_tokens: int = 0
    conversations: int | None = None
    concurrency: int | None = None
    repetition: int | None = None
    turns: int | None = None
    user_tokens: int = 0
    output_tokens: int = 0
    arrival: str = "waves"
    request_rate: float = 0.0


def view(cls: type[V], section: dict[str, Any]) -> V:
    """``section`` (a config section as the record keeps it) as its view ``cls``: the fields
    the view names, typed (a missing one: its default)."""
    data = dict(section)
    for axis in ("history_tokens", "conversations", "concurrency"):  # a Point's own value
        if isinstance(data.get(axis), list):  # records that kept the whole axis
            values = data[axis]
            data[axis] = values[0] if len(values) == 1 else -1
    return msgspec.convert(data, type=cls, strict=False)


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
    schema_version: int = POINT_SCHEMA
    job_id: str = ""  # the job that measured it (SLURM id, or the local process id)
    attempt: int = 0  # its SLURM_RESTART_COUNT: 1 and up in a requeued job

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @functools.cached_property
    def deployment_view(self) -> DeploymentView:
        """Its Deployment, typed (``DeploymentView``)."""
        return view(DeploymentView, self.deployment)

    @functools.cached_property
    def offered_view(self) -> OfferedLoadView:
        """Its offered load, typed (``OfferedLoadView``)."""
        return view(OfferedLoadView, self.offered_load)

    @functools.cached_property
    def workload_view(self) -> WorkloadView:
        """Its workload, typed (``WorkloadView``)."""
        return view(WorkloadView, self.workload)
