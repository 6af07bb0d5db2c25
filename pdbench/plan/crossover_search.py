"""The crossover search (pure): which (history length, load, repetition) blocks a crossover
run measures next, from the paired savings it has.

No fixed grid serves every deployment: published crossovers lie anywhere from ~30 to
~14,000 tokens, and on one kind of machine the same preset moved from ~43 to ~130 tokens.
So a run with no history lengths given searches:

1. a first pass: ``first_pass_lengths`` log-spaced lengths over the usable range (from
   ``min_history_tokens`` to what the model's context leaves; from 0: no history, then
   log-spaced from ``LOG_FLOOR``), ``workload.repetitions`` each, at every load;
2. rounds: per load, the paired saving ``s(h) = TTFT(recompute) - TTFT(pull)`` of every
   measured length (a cell: its repetitions' mean, with a standard error from the load's
   pooled relative spread, as the noise is multiplicative) locates the sign change: the
   pair of neighbouring lengths where the evidence for "recompute faster below, pull faster
   above" is strongest. A weighted line through the cells within ``WINDOW`` x of that pair
   gives the crossing and its 95% interval by test inversion (the lengths where the line's
   t band holds 0). The next round measures ``round_repetitions`` more at the interval's
   ends and at the estimate: there a repetition narrows the interval most;
3. a load stops when its interval is closed and narrower than ``target_relative_width`` of
   its estimate (or ``FINEST_WIDTH``); an interval reaching the shortest length is closed
   only once recompute is decided faster there (what the analysis needs too), one reaching
   the window's edge gets the next length beyond it; when pull (or recompute) is faster
   at every length, once the length nearest the missing crossing is decided; the run
   stops when every load has stopped, when ``budget_min`` of measuring is spent, or at
   ``max_points``.

The search only chooses what to measure: every block is an ordinary Point pair (records,
resume, the A/A control of turn 1) and the answer comes from the analysis of all of them.
The same observations give the same rounds, so a requeued job picks up where it was.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from pdbench.config.schema import Flow, SearchConfig, WorkloadConfig

WINDOW = 2.5  # the local line uses cells within this factor of the bracketing pair
EVERYWHERE_LEVEL = 0.99
RUNG_STEPS = 3  # rungs between two first-pass lengths: 8 lengths over 16..8,088 -> 22 rungs
MIN_CELLS = 3  # a load stops only on a line through at least this many lengths
GRID = 400  # lengths the test inversion looks at inside the window
# A search from 0 tokens goes on log-spaced from here (half a KV block of 32 tokens).
LOG_FLOOR = 16
# An interval this narrow is narrow enough whatever the crossover: a KV block (16-32 tokens),
# the finest step a threshold takes.
FINEST_WIDTH = 32
Z95 = 1.959963984540054


class SearchShape(StrEnum):
    CROSSING = "crossing"  # recompute faster below, pull faster above
    PULL_EVERYWHERE = "pull_faster_everywhere"
    RECOMPUTE_EVERYWHERE = "recompute_faster_everywhere"
    FALLING = "pull_faster_below"  # only downward sign changes: not what the search refines
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
class Cell:
    history: int
    mean_ms: float
    se_ms: float
    n: int
    level_ms: float

    def t(self) -> float:
        return (
            self.mean_ms / self.se_ms if self.se_ms > 0 else math.copysign(math.inf, self.mean_ms)
        )


@dataclass(frozen=True)
class LoadEstimate:
    """Where the search stands at one load."""

    load: int
    shape: SearchShape
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    closed: bool = False  # the interval ends inside the window on both sides
    lengths: int = 0
    observations: int = 0
    done: bool = False
    next_lengths: tuple[int, ...] = ()
    reason: str = ""

    def relative_width(self) -> float | None:
        if self.estimate and self.low is not None and self.high is not None:
            return (self.high - self.low) / self.estimate
        return None

    def describe(self) -> str:
        where = f"concurrency {self.load}"
        if self.shape is SearchShape.CROSSING and self.estimate is not None:
            width = self.relative_width()
            share = f", {width:.0%} of it" if width is not None else ""
            bound = "" if self.closed else " (open: reaches the window's edge)"
            return (
                f"{where}: crossover ~{self.estimate:,.0f} tokens, 95% CI "
                f"[{self.low:,.0f}, {self.high:,.0f}]{share}{bound}"
            )
        return f"{where}: {self.shape.value.replace('_', ' ')}" + (
            f" ({self.reason})" if self.reason else ""
        )

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


def t_quantile(df: int, level: float = 0.95) -> float:
    """Two-sided Student-t quantile (scipy, imported here: the job needs it, the CLI not)."""
    if df <= 0:
        return math.inf
    from scipy import stats  # lazy: heavy

    return float(stats.t.ppf(0.5 + level / 2, df))


def cells_of(observations: Iterable[Observation]) -> tuple[list[Cell], int]:
    """Cells by length (ascending) with standard errors from the pooled relative spread
    (the noise scales with TTFT), and the pooled degrees of freedom."""
    by_h: dict[int, list[Observation]] = defaultdict(list)
    for o in observations:
        by_h[o.history].append(o)
    squares, df = 0.0, 0
    for obs in by_h.values():
        if len(obs) < 2:
            continue
        mean = sum(o.saving_ms for o in obs) / len(obs)
        level = max(sum(o.level_ms for o in obs) / len(obs), 1e-9)
        squares += sum(((o.saving_ms - mean) / level) ** 2 for o in obs)
        df += len(obs) - 1
    rel_sd = math.sqrt(squares / df) if df else math.nan
    out = []
    for h in sorted(by_h):
        obs = by_h[h]
        mean = sum(o.saving_ms for o in obs) / len(obs)
        level = sum(o.level_ms for o in obs) / len(obs)
        se = rel_sd * level / math.sqrt(len(obs)) if df else math.inf
        out.append(Cell(h, mean, se, len(obs), level))
    return out, df


def bracket(cells: Sequence[Cell]) -> tuple[Cell, Cell] | None:
    """The neighbouring pair (below < 0 <= above) with the strongest evidence of an upward
    sign change, or None."""
    best, score = None, -math.inf
    for below, above in zip(cells, cells[1:], strict=False):
        if below.mean_ms < 0 <= above.mean_ms:
            s = min(-below.t(), above.t()) + 1e-9 * (above.t() - below.t())
            if s > score:
                best, score = (below, above), s
    return best


@dataclass(frozen=True)
class LocalLine:
    a: float  # saving at h = 0 (ms)
    b: float  # ms per token
    cov: tuple[tuple[float, float], tuple[float, float]]
    lo: float  # the window's range
    hi: float
    cells: int = 0  # lengths it was fitted to

    def at(self, h: float) -> float:
        return self.a + self.b * h

    def se(self, h: float) -> float:
        (vaa, vab), (_, vbb) = self.cov
        return math.sqrt(max(vaa + 2 * h * vab + h * h * vbb, 0.0))


def local_line(
    cells: Sequence[Cell], below: Cell, above: Cell, window: float = WINDOW
) -> LocalLine | None:
    """Weighted least squares of the cell means within ``window`` x of the pair (down to
    no history once that reaches under ``2 x LOG_FLOOR``: a ratio means little there)."""
    lo, hi = below.history / window, above.history * window
    lo = 0.0 if lo <= 2 * LOG_FLOOR else lo
    near = [c for c in cells if lo <= c.history <= hi and c.se_ms > 0 and math.isfinite(c.se_ms)]
    if len(near) < 2:
        return None
    sw = swx = swxx = swy = swxy = 0.0
    for c in near:
        w = 1.0 / c.se_ms**2
        sw += w
        swx += w * c.history
        swxx += w * c.history**2
        swy += w * c.mean_ms
        swxy += w * c.history * c.mean_ms
    det = sw * swxx - swx**2
    if det <= 0:
        return None
    b = (sw * swxy - swx * swy) / det
    a = (swy - b * swx) / sw
    # Lack of fit: cells further from the line than their errors allow (a stall, a bend)
    # widen the line's errors by the excess, never narrow them.
    chi2 = sum(((c.mean_ms - a - b * c.history) / c.se_ms) ** 2 for c in near)
    inflate = max(1.0, chi2 / (len(near) - 2)) if len(near) > 2 else 1.0
    cov = tuple(tuple(inflate * v for v in row) for row in ((swxx, -swx), (-swx, sw)))
    cov = ((cov[0][0] / det, cov[0][1] / det), (cov[1][0] / det, cov[1][1] / det))
    return LocalLine(a, b, cov, near[0].history, near[-1].history, len(near))


def crossing_interval(line: LocalLine, t: float) -> tuple[float, float, float, bool] | None:
    """(estimate, low, high, closed): the root of the line and the connected set of lengths
    around it where ``|s(h)| <= t se(h)``; closed when it ends inside the window."""
    if line.b <= 0:
        return None
    root = -line.a / line.b
    if not line.lo <= root <= line.hi:
        return None
    lo, hi = max(line.lo, 1.0), line.hi
    grid = [lo * (hi / lo) ** (i / (GRID - 1)) for i in range(GRID)]
    holds = [abs(line.at(h)) <= t * line.se(h) for h in grid]
    i = min(range(GRID), key=lambda k: abs(grid[k] - root))
    if not holds[i]:
        return root, root, root, True
    j, k = i, i
    while j > 0 and holds[j - 1]:
        j -= 1
    while k < GRID - 1 and holds[k + 1]:
        k += 1
    closed = j > 0 and k < GRID - 1
    return root, grid[j], grid[k], closed


def estimate_load(load: int, observations: Sequence[Observation], plan: SearchPlan) -> LoadEstimate:
    """Where the crossover stands at ``load``, whether that load is done, and the lengths
    its next round measures."""
    settings = plan.settings
    cells, df = cells_of(observations)
    base = {"load": load, "lengths": len(cells), "observations": len(observations)}
    if df == 0 or any(c.n < 2 for c in cells):
        missing = tuple(c.history for c in cells if c.n < 2) or plan.first_lengths
        return LoadEstimate(
            shape=SearchShape.UNDETERMINED,
            next_lengths=missing,
            reason="too few repetitions for a spread",
            **base,
        )
    t = t_quantile(df)
    # "Faster everywhere" is a test repeated after every round: decided at 99%, so that the
    # repeated looks still leave it wrong in about 5% of runs at most.
    t_end = t_quantile(df, EVERYWHERE_LEVEL)
    pair = bracket(cells)
    if pair is None:
        if all(c.mean_ms >= 0 for c in cells):
            # with no history pull and recompute differ by turn 1's few tokens alone: pull
            # faster everywhere is decided from the shortest history there is
            first = next((c for c in cells if c.history > 0), cells[0])
            decided = first.mean_ms - t_end * first.se_ms > 0
            return LoadEstimate(
                shape=SearchShape.PULL_EVERYWHERE,
                done=decided,
                next_lengths=() if decided else tuple(c.history for c in cells if c.history)[:2],
                reason=f"from {first.history:,} tokens on"
                + ("" if decided else f", undecided at {first.history:,}"),
                **base,
            )
        if all(c.mean_ms < 0 for c in cells):
            last = cells[-1]
            decided = last.mean_ms + t_end * last.se_ms < 0
            return LoadEstimate(
                shape=SearchShape.RECOMPUTE_EVERYWHERE,
                done=decided,
                next_lengths=() if decided else tuple(c.history for c in cells[-2:]),
                reason=f"up to {last.history:,} tokens"
                + ("" if decided else f", undecided at {last.history:,}"),
                **base,
            )
        return LoadEstimate(
            shape=SearchShape.FALLING,
            done=True,
            reason="the saving only falls through zero: the analysis describes it",
            **base,
        )
    below, above = pair
    line = local_line(cells, below, above)
    found = crossing_interval(line, t) if line else None
    if found is None:
        # Flat and noisy near the pair (a sign change that is noise around 0, the true one
        # further on): a line over a window twice as wide (in log) sees the rise.
        line = local_line(cells, below, above, WINDOW**2)
        found = crossing_interval(line, t) if line else None
    if found is None:  # no line crosses inside its window: measure between
        mid = plan.snap(math.sqrt(below.history * above.history))
        return LoadEstimate(
            shape=SearchShape.CROSSING,
            low=float(below.history),
            high=float(above.history),
            next_lengths=tuple(dict.fromkeys((below.history, mid, above.history))),
            reason="no local fit yet",
            **base,
        )
    root, low, high, closed = found
    # An interval down to the shortest length closes there only once that length's own
    # saving is decided (recompute faster): the analysis needs the same to close its
    # interval on that side, so until then the shortest length gets repetitions too.
    shortest = cells[0]
    shortest_decided = shortest.t() < -t
    at_shortest = low <= max(shortest.history, 1) * 1.001
    closed = closed or (at_shortest and high < line.hi and shortest_decided)
    wanted = max(settings.target_relative_width * root, FINEST_WIDTH)
    done = closed and high - low <= wanted and line.cells >= MIN_CELLS
    lengths = [plan.snap(h) for h in (low, root, high)]
    # An interval that runs into the window's edge needs a length beyond it: more
    # repetitions at the edge alone would leave it open there.
    if high >= line.hi * 0.999:
        lengths += plan.rungs_beyond(line.hi, above=True)
    if line.lo > 0 and low <= line.lo * 1.001:
        lengths += plan.rungs_beyond(line.lo, above=False)
    if line.cells < MIN_CELLS:  # a third length for the line: between the pair, or beside it
        measured = {c.history for c in cells}
        mid = plan.snap(math.sqrt(max(below.history, 1) * above.history))
        beside = [
            mid,
            *plan.rungs_beyond(above.history, above=True),
            *plan.rungs_beyond(below.history, above=False),
        ]
        lengths += [h for h in beside if h not in measured][:1]
    if low <= max(shortest.history, LOG_FLOOR) * WINDOW and not shortest_decided:
        lengths.append(shortest.history)
    lengths = tuple(dict.fromkeys(lengths))
    return LoadEstimate(
        shape=SearchShape.CROSSING,
        estimate=root,
        low=low,
        high=high,
        closed=closed,
        done=done,
        next_lengths=() if done else lengths,
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
    observations: Sequence[Observation],
    taken: Iterable[Block],
    spent_s: float,
    index: int,
) -> Round:
    """The blocks of round ``index`` (none when the search is done), from every observation
    so far (all attempts of the run), the blocks already measured or tried (``taken``) and
    the measuring time spent."""
    settings = plan.settings
    taken = list(taken)
    points = len(taken) * plan.flows_per_block
    estimates = [
        estimate_load(load, [o for o in observations if o.load == load], plan)
        for load in plan.loads
    ]
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
