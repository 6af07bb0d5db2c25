"""Log an analysis to W&B (``--wandb``) and build a W&B Report (``--wandb-report``).

Offline by default: the run files go to ``<out>/wandb`` and ``wandb sync`` uploads them
later (compute nodes rarely reach the internet). A Report needs a reachable server, an API
key in the environment (``WANDB_API_KEY``) and the ``wandb-workspaces`` package; each
missing piece is said plainly instead of failing the analysis. wandb and wandb-workspaces
are imported here, inside the functions.
"""

from __future__ import annotations

import netrc
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pandas as pd

from analysis.output.outputs import Outputs


def tables(out: Outputs) -> dict[str, pd.DataFrame]:
    """The dataframes logged as W&B Tables: every question's tables (``<question>/<table>``,
    each interval in its cells), the Points and the bench (all cells strings)."""
    frames = {
        f"{question}/{name}": pd.DataFrame(rows)
        for question, named in out.tables.questions.items()
        for name, rows in named.items()
    }
    frames["points"] = pd.DataFrame(out.tables.points)
    frames["bench"] = out.data.bench
    return {k: v.astype(str) for k, v in frames.items() if len(v)}


def summary_metrics(out: Outputs) -> dict[str, Any]:
    """Per deployment: the measured crossover with its 95% bounds, the predictions and the
    recommended threshold (None values left out); and whether the run is valid."""
    metrics: dict[str, Any] = {"valid": out.summary["valid"]}
    for d in out.summary["deployments"]:
        key = d["deployment_id"] + (f"@c{d['concurrency']}" if d.get("per_load") else "")
        m = d["measured"]
        metrics[f"crossover_tokens/measured/{key}"] = m["tokens"]
        metrics[f"crossover_tokens/measured_low/{key}"] = m["low"]
        metrics[f"crossover_tokens/measured_high/{key}"] = m["high"]
        metrics[f"crossover_verdict/{key}"] = m["verdict"]
        metrics[f"crossover_tokens/fit/{key}"] = d["predicted_fit"]["tokens"]
        metrics[f"crossover_tokens/first_principles/{key}"] = d["predicted_first_principles"][
            "tokens"
        ]
        metrics[f"recommended_threshold/{key}"] = d["recommended_kv_recompute_threshold"]["value"]
    return {k: v for k, v in metrics.items() if v is not None}


def wandb_key_problem(mode: str, environ: Mapping[str, str], home: Path) -> str:
    """Why an online W&B log would fail for want of a key ("" when one is there, or offline):
    ``WANDB_API_KEY``, else a ``~/.netrc`` entry for the W&B host (what ``wandb login``
    writes)."""
    if mode != "online" or environ.get("WANDB_API_KEY", "").strip():
        return ""
    host = urlparse(environ.get("WANDB_BASE_URL", "") or "https://api.wandb.ai").hostname or ""
    try:
        if host and netrc.netrc(str(home / ".netrc")).authenticators(host):
            return ""
    except (OSError, netrc.NetrcParseError):
        pass
    return (
        f"--wandb-mode online: no W&B key for {host} (WANDB_API_KEY is unset and ~/.netrc has "
        "none). Fix: export WANDB_API_KEY=... or run wandb login; or --wandb-mode offline, "
        "then wandb sync <out>/wandb/offline-run-*"
    )


def log_to_wandb(
    out: Outputs,
    mode: str = "offline",
    project: str = "pdbench",
    entity: str | None = None,
    build_report: bool = False,
) -> str:
    """Log tables, plots and the answer; returns what happened, in one or two lines."""
    try:
        import wandb  # lazy: heavy and optional
    except ImportError:
        return "W&B: the wandb package is not installed (pip install wandb); nothing logged"
    wandb_dir = out.out_dir / "wandb"
    wandb_dir.mkdir(parents=True, exist_ok=True)
    name = "analysis-" + "+".join(Path(d).name for d in out.data.run_dirs)
    provenance = {d: asdict(m.provenance) for d, m in out.data.manifests.items()}
    run = wandb.init(
        project=project,
        entity=entity,
        name=name,
        job_type="analysis",
        dir=str(wandb_dir),
        mode=mode,
        config={"run_dirs": [str(d) for d in out.data.run_dirs], "provenance": provenance},
        settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
    )
    try:
        for key, df in tables(out).items():
            run.log({f"tables/{key}": wandb.Table(dataframe=df)})
        run.log({f"plots/{p.stem}": wandb.Image(str(p)) for p in out.plots})
        run.summary.update(summary_metrics(out))
        run.summary["answer"] = "\n".join(out.summary["answer"])
        run_dir = run.dir
        url = run.url if mode == "online" else None
    finally:
        run.finish()
    if mode == "offline":
        msg = f"W&B: logged offline; upload with `wandb sync {Path(run_dir).parent}`"
    else:
        msg = f"W&B: logged run {url}"
    if build_report:
        msg += "\n" + build_wandb_report(out, name, project, entity, mode)
    return msg


def build_wandb_report(
    out: Outputs, run_name: str, project: str, entity: str | None, mode: str
) -> str:
    if mode != "online":
        return (
            "W&B Report: skipped, it needs a reachable W&B server; rerun with "
            "--wandb-mode online (and WANDB_API_KEY set)"
        )
    try:
        import wandb_workspaces.reports.v2 as wr  # lazy: optional, online reports only
    except ImportError:
        return (
            "W&B Report: the wandb-workspaces package is not installed "
            "(pip install wandb-workspaces); the run was logged without a Report"
        )
    try:
        owner = {"entity": entity} if entity else {}
        runset = wr.Runset(project=project, query=run_name, **owner)
        panels = [wr.WeavePanelSummaryTable(table_name=f"tables/{k}") for k in tables(out)]
        panels.append(wr.MediaBrowser(media_keys=[f"plots/{p.stem}" for p in out.plots]))
        report = wr.Report(
            project=project,
            title=f"pdbench: {run_name}"[:128],
            description="Pull vs recompute crossover, fits and plots (python -m analysis)",
            blocks=[
                wr.H1(text="Pull or recompute?"),
                *[wr.P(text=line) for line in out.summary["answer"]],
                wr.PanelGrid(runsets=[runset], panels=panels),
            ],
            **owner,
        )
        report.save()
    except Exception as exc:  # the server or the preview API said no: say so, keep going
        return f"W&B Report: not created ({type(exc).__name__}: {exc})"
    return f"W&B Report: {report.url}"
