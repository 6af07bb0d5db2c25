"""The questions the analysis answers, in the order the console answer, the HTML report
and W&B show them (each one module under ``analysis/questions/``)."""

from __future__ import annotations

from analysis.deployment import Context
from analysis.question import Answered, Question
from analysis.questions import (
    control,
    crossover,
    decode_cost,
    eviction,
    flagged,
    flows,
    placement,
    threshold,
    tp_pairing,
    transfer,
    ttft_split,
)

QUESTIONS: tuple[Question, ...] = (
    flagged.QUESTION,
    threshold.QUESTION,
    flows.QUESTION,
    placement.QUESTION,
    tp_pairing.QUESTION,
    crossover.QUESTION,
    decode_cost.QUESTION,
    eviction.QUESTION,
    control.QUESTION,
    transfer.QUESTION,
    ttft_split.QUESTION,
)


def answer_all(ctx: Context) -> list[Answered]:
    """Every question, asked or not (an unasked one has no answers)."""
    return [Answered(q, q.answer(ctx)) for q in QUESTIONS]


def by_name(answered: list[Answered]) -> dict[str, Answered]:
    return {a.question.name: a for a in answered}
