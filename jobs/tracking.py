"""Reporting behind a do-nothing default: one W&B run per measured Point.

The deployment job's rank 0 calls ``tracker.log_point(result, config)`` after each
PointResult is written, then ``tracker.close()``. ``Tracker`` does nothing; ``WandbTracker``
(``tracking=wandb``) creates one run per Point, named after the Point (its id starts with the
flow), grouped by run name, with the composed config plus the Point's deployment and
workload as W&B config, the PointResult summary as run summary, per-turn rows both as a
``wandb.Table`` (``by_turn``) and as steps (``turn/*`` keys, step = turn), and finishes it.

W&B is imported only here, inside ``WandbTracker``. Credentials and the server come from the
environment (``WANDB_API_KEY``, ``WANDB_BASE_URL``) and are never part of the config. Runs go
to ``<run dir>/wandb/`` (``offline-run-*`` in offline mode: ``wandb sync`` them later). A
tracking failure is printed and does not stop the benchmark: the record is already on disk.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pdbench.config.schema import TrackingBackend, TrackingConfig
from records.point import PointResult, PointStatus


class Tracker:
    """Reports nothing: the default (``tracking=none``)."""

    def log_point(self, point: PointResult, config: dict[str, Any]) -> None:
        """Report one PointResult measured under ``config``."""

    def close(self) -> None:
        """Flush and release whatever the tracker holds."""


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``; lists and other leaves are kept as they are."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


def point_summary(point: PointResult) -> dict[str, Any]:
    """The scalar results of one Point, flat, as W&B summary keys."""
    summary = flatten(asdict(point.summary))
    summary.update(flatten(asdict(point.transfer), "transfer/"))
    summary["status"] = str(point.status)
    summary["error"] = point.error
    return summary


def run_name_for(point: PointResult) -> str:
    """The Point's id, which starts with its flow; else the flow is put in front."""
    return (
        point.point_id
        if point.point_id.startswith(point.flow)
        else (f"{point.flow}-{point.point_id}")
    )


def point_tags(point: PointResult) -> list[str]:
    """The flow and the deployment's model, topology and transport names."""
    dep = point.deployment_view
    tags = [point.flow, dep.model.name, dep.topology.name, dep.transport.name]
    return [t for t in tags if t]


def turn_table_rows(point: PointResult) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of the ``by_turn`` table (``paths`` as JSON text)."""
    rows = [asdict(row) for row in point.by_turn]
    if not rows:
        return [], []
    columns = list(rows[0])

    def cell(value: Any) -> Any:
        return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value

    return columns, [[cell(row[c]) for c in columns] for row in rows]


class WandbTracker(Tracker):
    """One W&B run per Point, finished after logging."""

    def __init__(self, cfg: TrackingConfig, run_dir: Path, run_name: str):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.run_name = run_name
        self.logged = False

    def close(self) -> None:
        """Wait until W&B has written every run: ``run.finish()`` returns before its
        service has put the last records (the summary among them) in the offline run's
        ``.wandb`` file, and a job's task may end before wandb's own atexit hook runs."""
        if not self.logged:
            return
        import wandb  # lazy: a tracker that logged a Point has wandb imported already

        try:
            wandb.teardown()
        except (Exception, SystemExit) as exc:  # reporting must not fail a measured job
            print(f"[pdbench] W&B teardown failed: {exc!r}")

    def log_point(self, point: PointResult, config: dict[str, Any]) -> None:
        try:
            self._log(point, config)
        except Exception as exc:  # reporting must not lose a measured benchmark
            print(f"[pdbench] W&B logging of {point.point_id} failed: {exc!r}")

    def _log(self, point: PointResult, config: dict[str, Any]) -> None:
        import wandb  # lazy: wandb (~1 s) only when a Point is logged

        self.logged = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        run_config = {
            **config,
            "deployment": point.deployment,
            "workload": point.workload,
            "point_id": point.point_id,
            "flow": point.flow,
        }
        run = wandb.init(
            project=self.cfg.project or "pdbench",
            entity=self.cfg.entity or None,
            mode=str(self.cfg.mode),
            dir=str(self.run_dir),
            name=run_name_for(point),
            group=self.run_name,
            job_type=point.deployment_view.deployment_id or "point",
            tags=point_tags(point),
            config=run_config,
            settings=wandb.Settings(
                silent=True, console="off", x_disable_stats=True, disable_git=True
            ),
        )
        try:
            columns, rows = turn_table_rows(point)
            for row in point.by_turn:
                scalars = {k: v for k, v in asdict(row).items() if isinstance(v, int | float)}
                run.log({f"turn/{k}": v for k, v in scalars.items()}, step=row.turn)
            if rows:
                run.log({"by_turn": wandb.Table(columns=columns, data=rows)})
            run.summary.update(point_summary(point))
        finally:
            run.finish(exit_code=0 if point.status == PointStatus.ok else 1)


def make_tracker(cfg: TrackingConfig, run_dir: Path, run_name: str) -> Tracker:
    """The tracker ``cfg.backend`` names."""
    if cfg.backend is TrackingBackend.wandb:
        return WandbTracker(cfg, run_dir, run_name)
    return Tracker()
