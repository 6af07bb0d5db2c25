"""The questions the analysis answers, in the order the console answer, the HTML report
and W&B show them (each one module under ``analysis/questions/``)."""

from __future__ import annotations

from analysis.method.deployment import Context
from analysis.questions import (
    control,
    crossover,
    decode_cost,
    eviction,
    flagged,
    flows,
    placement,
    policy_check,
    replay,
    threshold,
    tp_pairing,
    transfer,
    ttft_split,
)
from analysis.questions.question import Answered, Question

QUESTIONS: tuple[Question, ...] = (
    flagged.QUESTION,
    policy_check.QUESTION,
    replay.QUESTION,
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


# The question each preset (``conf/experiment/<name>.yaml``, the manifest's config name) asks:
# answered first, right after the flags a reader must not miss.
PRESET_QUESTION = {
    "crossover": "crossover",
    "crossover_load": "crossover",
    "threshold_sweep": "threshold",
    "flows": "flows",
    "placement": "placement",
    "tp_pairings": "tp_pairing",
    "decode_cost": "decode_cost",
    "cache_pressure": "eviction",
    "transfer_bench": "transfer",
    "policy_check": "policy_check",
}


def preset_questions(ctx: Context) -> list[str]:
    """The questions the run dirs' presets ask, in the order of their dirs."""
    out = []
    for manifest in ctx.data.manifests.values():
        config = manifest.config  # the composed run config as JSON
        name = config.get("name", "") or manifest.name
        if (config.get("workload") or {}).get("kind") == "trace":
            out.append("replay")  # whatever the preset, a replay's first answer is its own
        if name in PRESET_QUESTION:
            out.append(PRESET_QUESTION[name])
    return list(dict.fromkeys(out))


def ordered(first: list[str]) -> tuple[Question, ...]:
    """``QUESTIONS`` with the ``first`` ones moved up behind ``flagged``."""
    head = [q for name in first for q in QUESTIONS if q.name == name]
    rest = [q for q in QUESTIONS if q not in head]
    return (*rest[:1], *head, *rest[1:])


def answer_all(ctx: Context) -> list[Answered]:
    """Every question, asked or not (an unasked one has no answers): the preset's own
    question first, after the flags."""
    return [Answered(q, q.answer(ctx)) for q in ordered(preset_questions(ctx))]


def by_name(answered: list[Answered]) -> dict[str, Answered]:
    return {a.question.name: a for a in answered}
