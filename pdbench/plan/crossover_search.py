"""The crossover search (pure): which (history length, load, repetition) blocks a crossover
run measures next, steered by the analysis's own answer on the records so far.

No fixed grid serves every deployment: published crossovers lie anywhere from ~30 to
~14,000 tokens, and on one kind of machine the same preset moved from ~43 to ~130 tokens.
So a run with no history lengths given searches:

1. a first pass: ``first_pass_lengths`` log-spaced lengths over the usable range (from
   ``min_history_tokens`` to what the model's context leaves; from 0: no history, then
   log-spaced from ``LOG_FLOOR``), ``workload.repetitions`` each, at every load;
2. rounds: per load, the analysis reads the crossover off every record so far, as
   ``python -m analysis`` would (``jobs.run.search_judge``: its fitted saving curve, the
   interval by test inversion, the verdict), and hands it here as a ``Reading``; ``steer``
   puts the next round's ``round_repetitions`` at the interval's ends and at the estimate
   (there a repetition narrows the interval most), at an open end and the next length
   beyond it, and between the lengths while fewer than ``MIN_CELLS`` were measured;
3. a load stops when the analysis decides it: a crossing whose interval is narrower than
   ``target_relative_width`` of its estimate (or ``FINEST_WIDTH``), or pull (recompute)
   faster everywhere, or a saving that falls (the analysis describes it); the run stops
   when every load has stopped, when ``budget_min`` of measuring is spent, or at
   ``max_points``.

One answer per quantity: what a round logs, and the search's last line, is the analysis's
answer on the same records, word for word. Looking after every round at 95% is a repeated
test, so a search stops on a decided verdict a little more often than one look at the end
would; the analysis of the finished run reads all of it again.

The search only chooses what to measure: every block is an ordinary Point pair (records,
resume, the A/A control of turn 1). The same records give the same rounds, so a requeued
job picks up where it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from pdbench.config.schema import Flow, SearchConfig, WorkloadConfig

RUNG_STEPS = 3  # rungs between two first-pass lengths: 8 lengths over 16..8,088 -> 22 rungs
MIN_CELLS = 3  # a load stops only on a fit through at least this many lengths
# A search from 0 tokens goes on log-spaced from here (half a KV block of 32 tokens).
LOG_FLOOR = 16
# An interval this narrow is narrow enough whatever the crossover: a KV block (16-32 tokens),
# the finest step a threshold takes.
FINEST_WIDTH = 32


class SearchShape(StrEnum):
    CROSSING = "crossing"  # recompute faster below, pull faster above
    PULL_EVERYWHERE = "pull_faster_everywhere"
    RECOMPUTE_EVERYWHERE = "recompute_faster_everywhere"
    FALLING = "pull_faster_below"  # only downward sign changes: not what the search refines
    MIXED = "changes_sign_more_than_once"
    UNDETERMINED = "undetermined"


@dataclass(frozen=True, order=True)
class Block:
    """One block of the run order: every flow once at (history, load, repetition)."""

    history: int
    load: int
    repetition: int


@dataclass(frozen=True)
class Observation:
    """One block's paired saving: recompute minus pull, mean TTFT of the turns that differ."""

    history: int
    load: int
    repetition: int
    saving_ms: float
    level_ms: float  # both flows' mean TTFT of those turns: the scale of the noise


@dataclass(frozen=True)
class Reading:
    """The analysis's crossover of one load on the records so far, as the planner needs it
    (``jobs.run.search_judge`` reads it off ``analysis.method.saving_curve.Crossover``):
    ``low``/``high`` None where the interval is open; ``lo``/``hi`` the measured range."""

    shape: SearchShape
    decided: bool
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    lo: float = 0.0
    hi: float = 0.0
    reason: str = ""
    text: str = ""  # the analysis's own words for it (``Crossover.describe``)


@dataclass(frozen=True)
class LoadEstimate:
    """Where the search stands at one load."""

    load: int
    shape: SearchShape
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    closed: bool = False  # the interval ends inside the measured range on both sides
    lengths: int = 0
    observations: int = 0
    done: bool = False
    next_lengths: tuple[int, ...] = ()
    reason: str = ""
    text: str = ""  # the analysis's words for this load's crossover (``Reading.text``)

    def relative_width(self) -> float | None:
        if self.estimate and self.low is not None and self.high is not None:
            return (self.high - self.low) / self.estimate
        return None

    def describe(self) -> str:
        """The analysis's answer for this load, as ``python -m analysis`` words it."""
        return f"concurrency {self.load}: {self.text or self.shape.value.replace('_', ' ')}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["shape"] = self.shape.value
        out["next_lengths"] = list(self.next_lengths)
        return out


@dataclass(frozen=True)
class Round:
    """What to measure next (``blocks``, none when done) and why."""

    index: int
    blocks: list[Block]
    estimates: list[LoadEstimate]
    done: bool
    why: str
    spent_s: float = 0.0
    points: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "round": self.index,
            "blocks": [asdict(b) for b in self.blocks],
            "estimates": [e.to_dict() for e in self.estimates],
            "done": self.done,
            "why": self.why,
            "spent_s": self.spent_s,
            "points": self.points,
        }


@dataclass(frozen=True)
class SearchPlan:
    """A Deployment's search: its settings, usable range, loads and flows (picklable)."""

    settings: SearchConfig
    min_tokens: int
    max_tokens: int
    loads: tuple[int, ...]
    flows_per_block: int = 2
    first_lengths: tuple[int, ...] = field(default=())
    workload: WorkloadConfig | None = None  # as composed: every search Point's base
    first_repetitions: int = 3  # of each first-pass length and each new length
    # the lengths rounds may add: the first pass's log spacing cut RUNG_STEPS times finer
    rungs: tuple[int, ...] = field(default=())

    def snap(self, tokens: float) -> int:
        """The rung nearest ``tokens`` (log distance): rounds add repetitions to a few
        lengths rather than one new length each, so that every length near the crossover
        gathers enough repetitions for its own interval and the analysis's."""
        rungs = self.rungs or self.first_lengths
        return min(rungs, key=lambda h: abs(math.log(max(h, 1) / max(tokens, 1))))

    flows: tuple[Flow, ...] = ()

    def rungs_beyond(self, tokens: float, above: bool) -> list[int]:
        """The next rung above (below) ``tokens``, if any."""
        rungs = self.rungs or self.first_lengths
        beyond = sorted(h for h in rungs if (h > tokens if above else h < tokens))
        return beyond[:1] if above else beyond[-1:]

    def first_pass(self) -> list[Block]:
        reps = self.first_repetitions
        return [
            Block(h, load, r)
            for load in self.loads
            for h in self.first_lengths
            for r in range(reps)
        ]

    def describe(self) -> str:
        s = self.settings
        return (
            f"crossover search: first pass {len(self.first_lengths)} lengths log-spaced over "
            f"{self.min_tokens:,}..{self.max_tokens:,} tokens x {self.first_repetitions} "
            f"repetitions at concurrency {', '.join(map(str, self.loads))}; then rounds of "
            f"{s.round_repetitions} repetitions at lengths chosen as it goes, until the 95% CI "
            f"is within {s.target_relative_width:.0%} of the crossover, {s.budget_min:g} min "
            f"of measuring or {s.max_points} Points"
        )


def nice_length(tokens: float) -> int:
    """A length rounded to two significant digits (16, 43, 120, 1,200): few distinct
    lengths, which the warm-up and the tables can name."""
    if tokens < 100:
        return max(1, round(tokens))
    digits = 10 ** (int(math.floor(math.log10(tokens))) - 1)
    return int(round(tokens / digits) * digits)


def log_spaced(low: int, high: int, count: int) -> list[int]:
    """``count`` lengths from ``low`` to ``high``, evenly spaced in log, rounded (``nice``);
    from 0: 0, then ``count - 1`` of them from ``LOG_FLOOR``."""
    if count <= 1 or high <= low:
        return [low]
    if low <= 0:
        return [0, *log_spaced(min(LOG_FLOOR, high), high, count - 1)]
    ratio = (high / low) ** (1 / (count - 1))
    lengths = [nice_length(low * ratio**i) for i in range(count)]
    lengths[0], lengths[-1] = low, high
    return sorted(dict.fromkeys(min(max(h, low), high) for h in lengths))


def search_plan(
    settings: SearchConfig,
    usable_max: int,
    loads: Sequence[int],
    flows_per_block: int,
    workload: WorkloadConfig | None = None,
    flows: Sequence[Flow] = (),
) -> SearchPlan:
    """The search over ``[min_history_tokens, max_history_tokens or usable_max]``."""
    high = min(settings.max_history_tokens or usable_max, usable_max)
    low = min(settings.min_history_tokens, high)
    return SearchPlan(
        settings=settings,
        min_tokens=low,
        max_tokens=high,
        loads=tuple(loads),
        flows_per_block=flows_per_block,
        first_lengths=tuple(log_spaced(low, high, settings.first_pass_lengths)),
        rungs=tuple(log_spaced(low, high, (settings.first_pass_lengths - 1) * RUNG_STEPS + 1)),
        workload=workload,
        flows=tuple(flows),
        first_repetitions=workload.repetitions if workload else 3,
    )


def steer(load: int, reading: Reading, counts: dict[int, int], plan: SearchPlan) -> LoadEstimate:
    """Where ``load`` stands by the analysis's ``reading`` of its records so far, whether it
    is done, and the lengths its next round measures (``counts``: repetitions measured per
    length at this load)."""
    lengths = sorted(counts)
    base = {
        "load": load,
        "lengths": len(lengths),
        "observations": sum(counts.values()),
        "text": reading.text,
    }
    if reading.shape is SearchShape.UNDETERMINED:
        few = tuple(h for h in lengths if counts[h] < 2) or plan.first_lengths
        return LoadEstimate(shape=reading.shape, next_lengths=few, reason=reading.reason, **base)
    if reading.shape is not SearchShape.CROSSING:  # faster everywhere, falling, mixed
        if reading.decided:
            return LoadEstimate(shape=reading.shape, done=True, reason=reading.reason, **base)
        ends = (*lengths[:2], *lengths[-2:])
        return LoadEstimate(shape=reading.shape, next_lengths=tuple(dict.fromkeys(ends)), **base)
    est, low, high = reading.estimate, reading.low, reading.high
    closed = reading.decided and low is not None and high is not None
    wanted = max(plan.settings.target_relative_width * (est or 0.0), FINEST_WIDTH)
    done = closed and est is not None and high - low <= wanted and len(lengths) >= MIN_CELLS
    if done:
        return LoadEstimate(
            shape=reading.shape, estimate=est, low=low, high=high, closed=True, done=True, **base
        )
    # a repetition narrows the interval most at its ends and at the estimate
    inside = [v for v in (low, est, high) if v is not None and reading.lo <= v <= reading.hi]
    want = [plan.snap(v) for v in inside]
    # an interval open at an end closes once the saving is decided there: more repetitions
    # at that end, and the next length beyond it
    if high is None:
        want += [lengths[-1], *plan.rungs_beyond(reading.hi, above=True)]
    if low is None:
        want += [lengths[0], *(plan.rungs_beyond(reading.lo, above=False) if reading.lo else [])]
    if len(lengths) < MIN_CELLS:  # a fit over too few lengths: one between them
        want.append(plan.snap(math.sqrt(max(lengths[0], 1) * max(lengths[-1], 1))))
    return LoadEstimate(
        shape=reading.shape,
        estimate=est,
        low=low,
        high=high,
        closed=closed,
        next_lengths=tuple(dict.fromkeys(want or (lengths[0], lengths[-1]))),
        **base,
    )


def next_repetition(taken: Iterable[Block]) -> dict[tuple[int, int], int]:
    """(history, load) -> the first repetition not measured yet (ok or failed)."""
    out: dict[tuple[int, int], int] = {}
    for b in taken:
        key = (b.history, b.load)
        out[key] = max(out.get(key, 0), b.repetition + 1)
    return out


def next_round(
    plan: SearchPlan,
    estimates: Sequence[LoadEstimate],
    taken: Iterable[Block],
    spent_s: float,
    index: int,
) -> Round:
    """The blocks of round ``index`` (none when the search is done), from where each load
    stands (``steer`` of the analysis's reading, one per load), the blocks already measured
    or tried (``taken``: all attempts of the run) and the measuring time spent."""
    settings = plan.settings
    taken = list(taken)
    points = len(taken) * plan.flows_per_block
    estimates = list(estimates)
    common = {"index": index, "estimates": estimates, "spent_s": spent_s, "points": points}
    if all(e.done for e in estimates):
        return Round(blocks=[], done=True, why="every load answered", **common)
    if spent_s >= settings.budget_min * 60:
        return Round(
            blocks=[], done=True, why=f"budget of {settings.budget_min:g} min spent", **common
        )
    after = next_repetition(taken)
    blocks: list[Block] = []
    for e in estimates:
        if e.done:
            continue
        for h in e.next_lengths:
            first = after.get((h, e.load), 0)
            reps = settings.round_repetitions if first else plan.first_repetitions
            blocks += [Block(h, e.load, r) for r in range(first, first + reps)]
    room = (settings.max_points - points) // max(plan.flows_per_block, 1)
    if not blocks:
        return Round(blocks=[], done=True, why="nothing left to measure", **common)
    if room < len(blocks):
        return Round(
            blocks=[], done=True, why=f"max_points ({settings.max_points}) reached", **common
        )
    return Round(blocks=blocks, done=False, why="narrowing the crossover's interval", **common)
