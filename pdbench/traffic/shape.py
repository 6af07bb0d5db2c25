"""What a trace looks like, in the numbers that decide whether pulling pays: how long
prompts are and how much of them is history, how many turns a conversation has, how long
people pause between turns (a pause past D's lease loses the pull), and how fast turns come."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from connector.bench_record import quantile  # the bench records' own, not a third
from pdbench.traffic.trace import Trace, context_needed, prompt_lengths


@dataclass(frozen=True)
class TraceShape:
    requests: int
    conversations: int
    branches: int  # conversations that share an earlier one's blocks (mooncake)
    turns_mean: float
    turns_max: int
    prompt_p50: float  # tokens of a turn's prompt in a replay (history included)
    prompt_p90: float
    prompt_max: int
    output_p50: float
    history_share: float  # of all prompt tokens, the share that is an earlier turn's
    context_max: int  # the longest conversation's last prompt and reply
    duration_s: float  # first to last offered time (nan: untimed)
    offered_per_s: float  # requests / duration (nan: untimed)
    gap_p50_s: float  # pause between a conversation's turns (nan: untimed or single turns)
    gap_p90_s: float

    def record(self) -> dict:
        return {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in asdict(self).items()
        }


def shape_of(trace: Trace) -> TraceShape:
    prompts: list[float] = []
    outputs: list[float] = []
    history = total = 0
    gaps: list[float] = []
    for c in trace.conversations:
        lengths = prompt_lengths(c)
        prompts += lengths
        outputs += [t.output_tokens for t in c.turns]
        total += sum(lengths)
        history += sum(p - t.user_tokens for p, t in zip(lengths, c.turns, strict=True))
        times = [t.at_s for t in c.turns if t.at_s is not None]
        gaps += [b - a for a, b in zip(times, times[1:], strict=False)]
    turns = [len(c.turns) for c in trace.conversations]
    times = [t.at_s for c in trace.conversations for t in c.turns if t.at_s is not None]
    duration = (max(times) - min(times)) if trace.timed and times else math.nan
    return TraceShape(
        requests=trace.requests,
        conversations=len(trace.conversations),
        branches=sum(bool(c.branch_of) for c in trace.conversations),
        turns_mean=sum(turns) / len(turns) if turns else 0.0,
        turns_max=max(turns, default=0),
        prompt_p50=quantile(prompts, 0.5),
        prompt_p90=quantile(prompts, 0.9),
        prompt_max=int(max(prompts, default=0)),
        output_p50=quantile(outputs, 0.5),
        history_share=history / total if total else 0.0,
        context_max=max((context_needed(c) for c in trace.conversations), default=0),
        duration_s=duration,
        offered_per_s=trace.requests / duration if duration and duration > 0 else math.nan,
        gap_p50_s=quantile(gaps, 0.5) if trace.timed else math.nan,
        gap_p90_s=quantile(gaps, 0.9) if trace.timed else math.nan,
    )


def _n(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def _s(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.1f} s"


def describe(before: TraceShape, after: TraceShape) -> list[str]:
    """The shape as recorded and as replayed, side by side, one quantity a line."""
    rows = [
        ("requests", _n(before.requests), _n(after.requests)),
        ("conversations", _n(before.conversations), _n(after.conversations)),
        ("  of them branches", _n(before.branches), _n(after.branches)),
        (
            "turns / conversation",
            f"{before.turns_mean:.1f} (max {before.turns_max})",
            f"{after.turns_mean:.1f} (max {after.turns_max})",
        ),
        ("prompt tokens p50", _n(before.prompt_p50), _n(after.prompt_p50)),
        ("prompt tokens p90", _n(before.prompt_p90), _n(after.prompt_p90)),
        ("prompt tokens max", _n(before.prompt_max), _n(after.prompt_max)),
        ("reply tokens p50", _n(before.output_p50), _n(after.output_p50)),
        ("history share", f"{before.history_share:.0%}", f"{after.history_share:.0%}"),
        ("longest context", _n(before.context_max), _n(after.context_max)),
        ("duration", _s(before.duration_s), _s(after.duration_s)),
        ("pause between turns p50", _s(before.gap_p50_s), _s(after.gap_p50_s)),
        ("pause between turns p90", _s(before.gap_p90_s), _s(after.gap_p90_s)),
    ]
    width = max(len(r[0]) for r in rows)
    left = max(len(r[1]) for r in rows)
    head = f"  {'':<{width}}  {'recorded':>{left}}  replayed"
    return [head] + [f"  {a:<{width}}  {b:>{left}}  {c}" for a, b, c in rows]
