"""Load -> answer every question -> write: the outputs of ``python -m analysis`` in ``<out>/``.

``<out>/summary.json`` (the answer, every question's verdicts with their intervals, notes),
``<out>/policy.json`` beside it when a crossover was measured (``policy``: for a router),
``<out>/report.html`` (self-contained), ``<out>/*.png`` and ``<out>/tables/*.csv`` (the
loaded dataframes).
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis.load.runs import Progress, RunData, load_runs
from analysis.method.deployment import Context
from analysis.output import policy, report
from analysis.output.answer import summary_dict
from analysis.output.outputs import Outputs
from analysis.output.plotting import make_plots
from analysis.output.tables import Tables
from analysis.questions.registry import answer_all


def write_tables(data: RunData, out_dir: Path) -> None:
    folder = out_dir / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("points", "turns", "requests", "traces", "bench"):
        df = getattr(data, name)
        if len(df):
            df.to_csv(folder / f"{name}.csv", index=False)


def run_analysis(
    run_dirs: list[str | Path],
    out_dir: Path | None = None,
    progress: Progress | None = None,
    slo: dict[str, float] | None = None,
) -> Outputs:
    """``slo``: goodput's bounds (``ttft_ms``, ``tpot_ms``) instead of the runs' own."""
    say = progress or (lambda _msg: None)
    data = load_runs(run_dirs, progress=progress)
    out = Path(out_dir) if out_dir else Path(run_dirs[0]) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context.of(data)
    ctx.slo = dict(slo or {})
    answered = answer_all(ctx)
    say(f"[analysis] plotting into {out} ...")
    made = make_plots(ctx, answered, out, progress)
    labels = [d.label for d in ctx.deployments()]
    summary = summary_dict(data, answered, [p.path.name for p in made], labels)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    tables = Tables.of(ctx, answered)  # every output's tables, computed once
    found = policy.policy_of(ctx)
    policy_path = policy.write(out / policy.FILE_NAME, found) if found else None
    write_tables(data, out)
    html_path = out / "report.html"
    html_path.write_text(report.render(ctx, answered, made, summary, tables))
    paths = [p.path for p in made]
    return Outputs(out, ctx, answered, summary, html_path, paths, tables, policy_path)
