"""What a question of the analysis is: one module under ``analysis/questions/`` owns its
answer, its tables, its plots and its summary; ``analysis/questions/registry.py`` lists them in the
order the console, the HTML report and W&B show them.

A question's ``answer(ctx)`` returns its answers (empty: the run did not ask it). Each
answer gives the console ``lines()`` (the first is its headline), ``tables()`` (name ->
rows of plain values, for the report and W&B) and ``to_dict()`` (summary.json); one may give
``card()``, the one sentence its answer card shows (else its headline's first line:
``card_of``). A plot is drawn from the answers with matplotlib's ``pyplot`` passed in
(``plotkit`` holds the shared helpers); None when there is nothing to draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from analysis.kit.fmt import shorten
from analysis.method.deployment import Context

CARD_CHARS = 240  # an answer card's sentence, at most


class Answer(Protocol):
    def lines(self) -> list[str]: ...

    def tables(self) -> dict[str, list[dict[str, Any]]]: ...

    def to_dict(self) -> dict[str, Any]: ...


Draw = Callable[[Any, list[Any], Context], Any]  # (pyplot, answers, ctx) -> Figure | None


@dataclass(frozen=True)
class PlotSpec:
    name: str  # file stem
    title: str
    draw: Draw
    caption: str = ""


@dataclass(frozen=True)
class Question:
    name: str  # summary.json key, W&B table prefix
    title: str  # a heading, as a question
    answer: Callable[[Context], list[Any]]
    plots: tuple[PlotSpec, ...] = ()
    method: str = ""  # how it is answered (report, HTML allowed)
    # Explains the other answers (fits, the TTFT split): an answer card only in a run that
    # answers nothing else (a transfer bench's run).
    supporting: bool = False


@dataclass
class Note:
    """A remark among a question's answers, not an answer to it (no headline): one line,
    no tables; summary.json gets ``{"note": text}`` and ``fields``."""

    headline = False

    text: str
    fields: dict[str, Any] = field(default_factory=dict)

    def lines(self) -> list[str]:
        return [self.text]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"note": self.text, **self.fields}


@dataclass
class Answered:
    question: Question
    answers: list[Any] = field(default_factory=list)

    @property
    def asked(self) -> bool:
        return bool(self.answers)

    def lines(self) -> list[str]:
        return [line for a in self.answers for line in a.lines()]

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """Every answer's rows, table by table."""
        out: dict[str, list[dict[str, Any]]] = {}
        for a in self.answers:
            for name, rows in a.tables().items():
                out.setdefault(name, []).extend(rows)
        return {k: v for k, v in out.items() if v}

    def to_dict(self) -> list[dict[str, Any]]:
        return [a.to_dict() for a in self.answers]

    def cards(self) -> list[str]:
        """One sentence per answer that answers (notes and warnings left out)."""
        return [card_of(a) for a in self.answers if getattr(a, "headline", True)]


def card_of(answer: Any) -> str:
    """The sentence an answer card shows: the answer's own ``card()``, else the first line
    of its headline, its asides in parentheses dropped only where it runs long."""
    if hasattr(answer, "card"):
        return answer.card()
    first = answer.lines()[0].split("\n", 1)[0]
    return shorten(first, CARD_CHARS)


def without_parentheses(text: str) -> str:
    """``text`` without its parenthesised asides (nested ones too)."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    text = " ".join("".join(out).split())
    return text.replace(" ;", ";").replace(" ,", ",").replace(" .", ".").replace(" :", ":")
