"""What one ``python -m analysis`` wrote, and what it answered (``analysis.pipeline``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.load.runs import RunData
from analysis.method.deployment import Context
from analysis.output.tables import Tables
from analysis.questions.question import Answered


@dataclass
class Outputs:
    out_dir: Path
    ctx: Context
    answered: list[Answered]
    summary: dict[str, Any]
    report: Path
    plots: list[Path]
    tables: Tables  # every output's tables, computed once
    policy: Path | None = None  # policy.json, when a crossover was measured

    @property
    def data(self) -> RunData:
        return self.ctx.data
