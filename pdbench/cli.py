"""What each ``command`` does once the config is typed and validated."""

from __future__ import annotations

from pathlib import Path

from pdbench.config import RunConfig
from pdbench.launch import launch, run_transfer_bench
from pdbench.report_table import print_run_table
from pdbench.results import RunStore
from pdbench.status import print_status


def dispatch(cfg: RunConfig) -> None:
    cfg.dir = str(Path(cfg.dir).expanduser().resolve())  # jobs may start elsewhere
    if cfg.command == "status":
        print_status(cfg.dir)
        return
    if cfg.command == "transfer_bench":
        run_transfer_bench(cfg)
        return
    outcome = launch(cfg)
    if outcome.get("dry_run"):
        return
    store = RunStore(cfg.dir)
    print_run_table(store.iter_points(), cfg.dir)
    failed_jobs = [r for r in outcome.get("results", []) if "error" in r]
    if failed_jobs or any(p.get("status") != "ok" for p in store.iter_points()):
        raise SystemExit(1)
