"""How many Points one SLURM attempt of a job can hold (pure): what the dry run says.

An attempt has the time limit, less the checkpoint's signal before it (USR2) and the servers'
start (at most ``server.startup_timeout_s``: the bound, not a guess). A Point takes what
Points of this run dir took (their median, once some are recorded), else a rough estimate,
labelled so: per batch of conversations in flight, each turn is P's prefill wave of the full
context (recompute's cost, pull's upper bound; ``pdbench.plan.prefill_wave``) and
``DECODE_STEP_S`` per output token, plus D's TTL when ``flow.kv_tail`` waits it out and
``POINT_OVERHEAD_S``. Without ``cluster.gpu_tflops`` there is no estimate, and the line
says what would give one. A job holds its plan's Points, or up to its search's cap
(``job_points``): what the line counts attempts for, and what a job's requeues are sized by.
A crossover search's first pass is estimated the same way (``first_pass``): its budget is
looked at only after it, so validation refuses a first pass the budget cannot hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdbench.config.schema import RunConfig
from pdbench.plan.crossover_search import SearchPlan
from pdbench.plan.deployments import Plan
from pdbench.plan.lengths import longest_history
from pdbench.plan.prefill_wave import in_flight, prefill_seconds
from records.point import PointResult, PointStatus

DECODE_STEP_S = 0.03  # assumed: one decode step of a batch under load on a GPU (rough)
POINT_OVERHEAD_S = 10.0  # assumed: a Point's own bookkeeping (scrapes, records, KV samples)
ROUGH = (
    "rough estimate: P's prefill of each turn's full context at the assumed MFU of "
    "cluster.gpu_tflops, {step:g} s per output token"
)

# SLURM sends submitit's USR2 this long before the time limit (sbatch --signal=USR2@N): the
# job checkpoints and requeues itself, and its servers get time to shut down cleanly.
SIGNAL_DELAY_S = 120


def signal_delay_s(time_limit_min: int, configured_s: int = 0) -> int:
    """Seconds before the time limit that USR2 comes: ``cluster.signal_delay_s`` when set,
    else SIGNAL_DELAY_S at most half the limit.

    A delay longer than the limit would signal (and requeue) the job as soon as it starts
    (validation refuses one that is set so).
    """
    if configured_s > 0:
        return configured_s
    return max(1, min(SIGNAL_DELAY_S, time_limit_min * 60 // 2))


@dataclass(frozen=True)
class Attempt:
    """One attempt's time and how many Points fit in it."""

    time_limit_s: float
    signal_s: float
    startup_s: float
    point_s: float | None  # None: no estimate
    basis: str  # where point_s comes from
    job_points: int  # the most Points one job measures

    @property
    def measuring_s(self) -> float:
        return self.time_limit_s - self.signal_s - self.startup_s

    @property
    def points(self) -> int | None:
        if self.point_s is None or self.point_s <= 0:
            return None
        return max(0, math.floor(self.measuring_s / self.point_s))

    @property
    def attempts(self) -> int | None:
        """Attempts the job needs by the estimate, at least one Point each (None: no estimate;
        where not one Point fits, no number of attempts does: ``describe`` says so)."""
        if self.points is None:
            return None
        return math.ceil(self.job_points / max(1, self.points))

    def limit_min_for(self, points: int) -> int:
        """The time limit (minutes) one attempt of ``points`` Points needs."""
        return math.ceil((self.signal_s + self.startup_s + points * (self.point_s or 0)) / 60) + 1

    def describe(self) -> str:
        head = (
            f"each SLURM attempt: time limit {self.time_limit_s / 60:g} min, less "
            f"{self.signal_s:g} s for the checkpoint (USR2) and up to {self.startup_s:g} s for "
            "the servers' start "
            f"(server.startup_timeout_s), leaves {max(0.0, self.measuring_s):.0f} s to measure"
        )
        if self.points is None:
            return (
                f"{head}; Points per attempt unknown: {self.basis} (cluster.gpu_tflops=<one "
                "GPU's dense TFLOPS> gives a rough one; a first attempt's records a measured one)"
            )
        per = f"a Point takes about {self.point_s:.0f} s ({self.basis})"
        if self.points < 1:
            need = self.limit_min_for(1)
            return (
                f"{head}; {per}: no Point fits, and an attempt that records none is not "
                f"requeued. Fix: cluster.time_limit_min={need} or more"
            )
        return (
            f"{head}; {per}: about {self.points} Point(s) per attempt, so a job of "
            f"{self.job_points} Point(s) needs about {self.attempts} attempt(s)"
        )


def estimated_point_s(cfg: RunConfig, history: int) -> float | None:
    """A rough duration of one Point at history length ``history`` (None: unknown GPU)."""
    gpu_tflops, p, w = cfg.cluster.gpu_tflops, cfg.topology.prefill, cfg.workload
    if gpu_tflops <= 0 or p.count < 1:
        return None
    flying = in_flight(cfg)
    batches = math.ceil(max(w.conversations) / max(1, flying))
    per_p = math.ceil(flying / p.count)
    turns = max(w.turns, w.turns_max)
    seconds = 0.0
    for turn in range(1, turns + 1):
        context = w.common_prefix_tokens + history + turn * w.user_tokens
        context += (turn - 1) * w.output_tokens
        wave = per_p * prefill_seconds(cfg.model, context, p.tp, gpu_tflops)
        seconds += wave + w.output_tokens * DECODE_STEP_S
    tail = max(cfg.flow.decoder_kv_blocks_ttl_s) + 5 if cfg.flow.kv_tail else 0
    return batches * seconds + tail + POINT_OVERHEAD_S


def median_point_s(records: list[PointResult]) -> float | None:
    """The median duration of the Points recorded ok (None: none recorded)."""
    spans = sorted(
        r.finished_at - r.started_at
        for r in records
        if r.status == PointStatus.ok and r.finished_at > r.started_at > 0
    )
    if not spans:
        return None
    middle = len(spans) // 2
    return spans[middle] if len(spans) % 2 else (spans[middle - 1] + spans[middle]) / 2


def attempt(
    cfg: RunConfig, history: int, job_points: int, measured_point_s: float | None = None
) -> Attempt:
    """The attempt of a job of ``job_points`` Points whose longest history is ``history``;
    ``measured_point_s``: the median duration of Points this run dir already recorded."""
    limit_s = 60.0 * cfg.cluster.time_limit_min
    signal_s = float(signal_delay_s(cfg.cluster.time_limit_min, cfg.cluster.signal_delay_s))
    if measured_point_s:
        point_s, basis = measured_point_s, "the median of the Points this dir recorded"
    else:
        point_s = estimated_point_s(cfg, history)
        basis = (
            ROUGH.format(step=DECODE_STEP_S)
            if point_s is not None
            else "no Point recorded in this dir and no cluster.gpu_tflops"
        )
    return Attempt(
        limit_s, signal_s, float(cfg.server.startup_timeout_s), point_s, basis, job_points
    )


def job_points(plan: Plan, deployment_id: str) -> int:
    """The most Points a Deployment's job measures: its plan's, or its search's cap."""
    search = plan.searches.get(deployment_id)
    planned = len(plan.points[deployment_id])
    return max(planned, search.settings.max_points) if search is not None else planned


def attempt_line(cfg: RunConfig, plan: Plan, records: list[dict]) -> str:
    """How many Points one attempt of the largest job holds, ``records`` being the Points the
    run dir recorded (their median duration, else the estimate)."""
    measured = median_point_s(records)
    most = max(job_points(plan, d.deployment_id) for d in plan.deployments)
    return attempt(cfg, longest_history(cfg), most, measured).describe()


@dataclass(frozen=True)
class FirstPass:
    """A crossover search's first pass by the rough estimate (``estimated_point_s``)."""

    points: int
    longest: int  # its longest history
    seconds: float | None  # None: no cluster.gpu_tflops, no estimate

    def describe(self, budget_min: float) -> str:
        if self.seconds is None:
            return ""
        fits = "within" if self.seconds <= 60 * budget_min else "over"
        return (
            f"the search's first pass: {self.points} Points up to {self.longest:,} tokens, "
            f"about {self.seconds / 60:,.0f} min by the {ROUGH.format(step=DECODE_STEP_S)} "
            f"({fits} search.budget_min={budget_min:g})"
        )


def first_pass(cfg: RunConfig, search: SearchPlan) -> FirstPass:
    """What the search's first pass measures and, with ``cluster.gpu_tflops``, how long."""
    flows, loads = max(1, search.flows_per_block), max(1, len(search.loads))
    each = search.first_repetitions * flows * loads
    points = len(search.first_lengths) * each
    longest = max(search.first_lengths, default=0)
    times = [estimated_point_s(cfg, h) for h in search.first_lengths]
    if any(t is None for t in times):
        return FirstPass(points, longest, None)
    return FirstPass(points, longest, sum(times) * each)
