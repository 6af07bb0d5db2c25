"""What validation rules return: one ``ConfigProblem`` per thing wrong, ``ConfigError`` for all.

Its own module so that rule modules (``pdbench.validate.rules``, ``pdbench.validate.gpu``) share
the types without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pdbench.config.schema import RunConfig


@dataclass
class ConfigProblem:
    """One thing wrong with a config: where, what it is, why it is wrong, what to do."""

    field: str
    value: Any
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}={self.value}: {self.message}. Fix: {self.fix}"


class ConfigError(ValueError):
    """Raised by ``check`` with every problem of a config, one per line."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = list(problems)
        lines = "\n".join(str(p) for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in the config:\n{lines}")


Rule = Callable[[RunConfig], list[ConfigProblem]]


class Problems(list[ConfigProblem]):
    """What one rule found; ``add`` keeps each rule short."""

    def add(self, field: str, value: Any, message: str, fix: str) -> None:
        self.append(ConfigProblem(field, value, message, fix))
