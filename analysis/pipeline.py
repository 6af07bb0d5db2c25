"""Load -> analyse -> write: the outputs of ``python -m analysis`` in ``<out>/``.

``<out>/summary.json`` (the answer, fits, crossovers, notes), ``<out>/report.html``
(self-contained), ``<out>/*.png`` and ``<out>/tables/*.csv`` (the loaded dataframes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.answer import summary_dict
from analysis.crossover import DeploymentAnalysis, analyze
from analysis.load import Progress, RunData, load_runs
from analysis.questions import Questions, answer_questions


@dataclass
class Outputs:
    out_dir: Path
    data: RunData
    analyses: list[DeploymentAnalysis]
    questions: Questions
    summary: dict[str, Any]
    report: Path
    plots: list[Path]


def write_tables(data: RunData, out_dir: Path) -> None:
    folder = out_dir / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("points", "turns", "requests", "traces", "bench"):
        df = getattr(data, name)
        if len(df):
            df.to_csv(folder / f"{name}.csv", index=False)


def run_analysis(
    run_dirs: list[str | Path], out_dir: Path | None = None, progress: Progress | None = None
) -> Outputs:
    from analysis import plots as plotting
    from analysis import report

    say = progress or (lambda _msg: None)
    data = load_runs(run_dirs, progress=progress)
    out = Path(out_dir) if out_dir else Path(run_dirs[0]) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    analyses = analyze(data)
    questions = answer_questions(data, analyses)
    say(f"[analysis] plotting into {out} ...")
    made = plotting.make_plots(data, analyses, out, progress, questions)
    summary = summary_dict(data, analyses, [p.path.name for p in made], questions)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_tables(data, out)
    html_path = out / "report.html"
    html_path.write_text(report.render(data, analyses, made, questions=questions))
    return Outputs(out, data, analyses, questions, summary, html_path, [p.path for p in made])
