"""What a question of the analysis is: one module under ``analysis/questions/`` owns its
answer, its tables, its plots and its summary; ``analysis/questions/registry.py`` lists them in the
order the console, the HTML report and W&B show them.

A question's ``answer(ctx)`` returns its answers (empty: the run did not ask it). Each
answer gives the console ``lines()`` (the first is its headline), ``tables()`` (name ->
rows of plain values, for the report and W&B) and ``to_dict()`` (summary.json). A plot is
drawn from the answers with matplotlib's ``pyplot`` passed in (``plotkit`` holds the shared
helpers); None when there is nothing to draw.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from analysis.method.deployment import Context


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
