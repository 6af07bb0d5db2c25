"""The answer in words and as JSON (pure): the Points' count, an invalid run's warning, then
every question the run asked, in ``registry`` order."""

from __future__ import annotations

from typing import Any

from analysis.kit.fmt import json_safe
from analysis.load.runs import RunData
from analysis.questions.control import invalid_lines
from analysis.questions.question import Answered
from analysis.questions.registry import by_name

CORRUPT_SHOWN = 5


def count_line(data: RunData, deployments: int) -> str:
    pts = data.points
    ok = int((pts["status"] == "ok").sum()) if len(pts) else 0
    total = len(pts) + len(data.corrupt_points)
    line = f"{ok} of {total} Points ok across {deployments} deployment(s)"
    if len(pts) and "repetition" in pts:
        reps = (
            pts[pts["status"] == "ok"]
            .groupby(["deployment_id", "flow", "kind", "history_tokens"])["repetition"]
            .nunique()
        )
        if len(reps):
            lo, hi = int(reps.min()), int(reps.max())
            line += f", {lo if lo == hi else f'{lo}-{hi}'} repetition(s) per cell"
    if data.corrupt_points:
        line += f"; {len(data.corrupt_points)} corrupt Point record(s), not counted ok"
    if data.corrupt_requests:
        line += f"; {len(data.corrupt_requests)} request file(s) with unreadable lines"
    return line + "."


def corrupt_lines(data: RunData) -> list[str]:
    if not data.corrupt:
        return []
    shown = [f"  ! {c}" for c in data.corrupt[:CORRUPT_SHOWN]]
    if len(data.corrupt) > CORRUPT_SHOWN:
        shown.append(f"  ... and {len(data.corrupt) - CORRUPT_SHOWN} more (summary.json)")
    return ["Corrupt records (truncated or not JSON):\n" + "\n".join(shown)]


def answer_lines(data: RunData, answered: list[Answered]) -> list[str]:
    if not len(data.points):
        lines = [
            "No Point records found "
            f"({', '.join(str(d) for d in data.run_dirs)}): nothing was measured yet, or the "
            "run dir is wrong (expected <run>/points/*.json)."
        ]
        return lines + corrupt_lines(data)
    deployments = data.points["deployment_id"].nunique()
    control = by_name(answered).get("control")
    lines = [count_line(data, deployments)]
    lines += corrupt_lines(data)
    lines += invalid_lines(control.answers) if control else []
    for a in answered:
        lines += a.lines()
    return lines


def answer_cards(
    data: RunData, answered: list[Answered], labels: list[str]
) -> list[dict[str, Any]]:
    """The answer cards, each ``{"question": title, "answers": [sentence, ...]}``: what was
    measured (no question), a failed control, then each question's verdicts in one sentence
    each (number, interval, load, action), and how many Points are flagged. The details
    follow in ``answer_lines``. With one deployment (``labels``) its label is said once, in
    the first card, not before every answer."""
    if not len(data.points):
        return [{"question": "", "answers": answer_lines(data, answered)}]
    first = count_line(data, data.points["deployment_id"].nunique())
    lone = labels[0] if len(set(labels)) == 1 else ""
    facts = [first[:-1] + f": {lone}." if lone else first]
    control = by_name(answered).get("control")
    invalid = invalid_lines(control.answers) if control else []
    facts += [line.split("\n", 1)[0] for line in invalid]
    facts += corrupt_lines(data)
    cards = [{"question": "", "answers": facts}]
    main = [a for a in answered if a.asked and not a.question.supporting]
    main = [a for a in main if a.question.name not in ("flagged", "control")]
    for a in answered:
        if a.question.supporting and main or not a.asked:
            continue
        if a.question.name == "flagged":
            flagged = sum(len(getattr(f, "points", [])) for f in a.answers)
            if flagged:
                cards[0]["answers"].append(
                    f"{flagged} Point(s) flagged: their numbers are suspect (see the details)"
                )
            continue
        said = [without_label(c, lone) for c in a.cards()]
        if a.question.name == "control" and not invalid and len(said) > 1:
            said = [f"A/A control passes in all {len(said)}: the flows were measured alike"]
        if said:
            cards.append({"question": a.question.title, "answers": said})
    return cards


def without_label(card: str, label: str) -> str:
    """``card`` without the deployment ``label`` it starts with (said once, above)."""
    if label and card.startswith(f"{label}: "):
        return card[len(label) + 2 :]
    if label and card.startswith(f"{label} · "):
        return card[len(label) + 3 :]
    return card


def card_lines(cards: list[dict[str, Any]]) -> list[str]:
    """The cards as the terminal prints them: ``Question → answer`` for a question of one
    answer, the question then its answers indented for several."""
    lines = []
    for card in cards:
        question, answers = card["question"], card["answers"]
        if not question:
            lines += answers
        elif len(answers) == 1:
            lines.append(f"{question} → {answers[0]}")
        else:
            lines += [question, *(f"  {a}" for a in answers)]
    return lines


def valid(answered: list[Answered]) -> bool:
    control = by_name(answered).get("control")
    return not (control and invalid_lines(control.answers))


def summary_dict(
    data: RunData, answered: list[Answered], plots: list[str], labels: list[str] | None = None
) -> dict[str, Any]:
    pts = data.points
    bench = data.bench
    flagged = int(bench["flag"].fillna(False).astype(bool).sum()) if "flag" in bench else 0
    names = by_name(answered)
    crossover = names.get("crossover")
    return json_safe(
        {
            "run_dirs": [str(d) for d in data.run_dirs],
            "cards": answer_cards(data, answered, labels or []),
            "answer": answer_lines(data, answered),
            "valid": valid(answered),
            "questions": {a.question.name: a.to_dict() for a in answered if a.asked},
            "points": {
                "total": len(pts) + len(data.corrupt_points),
                "ok": int((pts["status"] == "ok").sum()) if len(pts) else 0,
                "failed": int((pts["status"] != "ok").sum()) if len(pts) else 0,
                "corrupt": len(data.corrupt_points),
                "flagged": sum(len(f.points) for f in names["flagged"].answers)
                if "flagged" in names
                else 0,
            },
            "corrupt": data.corrupt,
            "transfer_bench": {"records": len(bench), "flagged": flagged},
            "traces": len(data.traces),
            "deployments": [
                d for d in (crossover.to_dict() if crossover else []) if "deployment_id" in d
            ],
            "notes": data.notes,
            "plots": plots,
        }
    )
