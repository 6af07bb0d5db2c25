"""What each ``command`` does once the config is typed and validated."""

from __future__ import annotations

from pdbench.config import RunConfig


def dispatch(cfg: RunConfig) -> None:
    from pathlib import Path

    cfg.dir = str(Path(cfg.dir).expanduser().resolve())  # jobs may start elsewhere
    if cfg.command == "status":
        from pdbench.status import print_status

        print_status(cfg.dir)
        return
    if cfg.command == "transfer_bench":
        from jobs.transfer_bench import run_transfer_bench

        run_transfer_bench(cfg)
        return
    from pdbench.launch import launch
    from pdbench.report_table import print_run_table
    from pdbench.results import RunStore

    outcome = launch(cfg)
    if outcome.get("dry_run"):
        return
    store = RunStore(cfg.dir)
    print_run_table(store.iter_points(), cfg.dir)
    failed_jobs = [r for r in outcome.get("results", []) if "error" in r]
    if failed_jobs or any(p.get("status") != "ok" for p in store.iter_points()):
        raise SystemExit(1)
