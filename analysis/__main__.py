"""``python -m analysis RUN_DIR [RUN_DIR...]``: crossover, fits, plots, HTML (and W&B) report.

The answer printed first: the flagged Points, then each preset's question the run holds
(best ``kv_recompute_threshold``, best flow per workload, same vs cross node; see
``analysis/questions.py``), then the pull-vs-recompute crossover per deployment.

Every comparison carries its 95% confidence interval, or says "inconclusive" and how
many repetitions would decide it; a run whose A/A control (turn 1) fails is marked INVALID.

Outputs go to ``<first RUN_DIR>/analysis/`` (``--out`` to change): summary.json,
policy.json (when a crossover was measured: ``analysis/output/policy.py``), report.html, PNG
plots, tables/*.csv. Several run dirs are analysed together (e.g. a
crossover sweep and a transfer-bench run). Exit status: 0 analysed, 1 no Point records
found (outputs still written, saying so), 2 bad arguments, 3 corrupt records found (named;
outputs still written without them; ``--skip-corrupt`` exits 0 instead).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from analysis.output.answer import card_lines
from analysis.output.wandb_report import log_to_wandb, wandb_key_problem
from analysis.pipeline import run_analysis
from pdbench.results.store import RUN_FOLDERS
from records.versions import SchemaVersionError

CORRUPT = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.split("\n")[0])
    ap.add_argument("run_dirs", nargs="+", help="results/<run> directories")
    ap.add_argument("--out", type=Path, help="output folder (default <RUN_DIR>/analysis)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print the answer only")
    ap.add_argument(
        "--details",
        action="store_true",
        help="print every answer's figures and the notes (by default: one answer card per "
        "question; the report and summary.json hold the details)",
    )
    ap.add_argument(
        "--skip-corrupt",
        action="store_true",
        help="analyse around corrupt (truncated, not JSON) records and exit 0; they are still "
        "named and counted",
    )
    for name in ("ttft", "tpot"):
        ap.add_argument(
            f"--slo-{name}-ms",
            type=_slo_ms,
            default=None,
            help=f"goodput's {name.upper()} bound, ms (default: the run's slo.{name}_ms; 0: none)",
        )
    ap.add_argument("--wandb", action="store_true", help="log tables and plots to W&B")
    ap.add_argument(
        "--wandb-mode",
        choices=("offline", "online"),
        default="offline",
        help="offline (default): run files in <out>/wandb, sync later with `wandb sync`",
    )
    ap.add_argument("--wandb-project", default="pdbench")
    ap.add_argument("--wandb-entity", default=None)
    ap.add_argument(
        "--wandb-report",
        action="store_true",
        help="also build a W&B Report (online, needs the wandb-workspaces package)",
    )
    return ap.parse_args(argv)


def _slo_ms(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text}: a finite number of ms, 0 or more")
    return value


def out_dir_problem(out: Path, given: bool) -> str:
    """Why the outputs cannot go to ``out`` ('' when they can); creates it to find out."""
    name = f"--out {out}" if given else f"{out} (the default --out)"
    fix = "Fix: --out <a directory this user may write, created if missing>"
    if out.exists() and not out.is_dir():
        return f"{name}: is a file, not a directory. {fix}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{name}: cannot be created ({exc.strerror or exc}). {fix}"
    if not os.access(out, os.W_OK | os.X_OK):
        return f"{name}: is not writable by this user. {fix}"
    return ""


def inside_records(out: Path) -> str:
    """Why ``out`` lies among a run's records ('' when it does not): the run dir itself,
    or a folder the run writes (``RUN_FOLDERS``), where its outputs would be read back."""
    where = out.expanduser().resolve()
    for run in (where, *where.parents):
        if (run / "manifest.json").is_file():
            inner = where.relative_to(run).parts
            if not inner:
                return f"is the run dir {run} itself"
            if inner[0] in RUN_FOLDERS:
                return f"is inside the records of the run {run} ({inner[0]}/)"
            return ""
    return ""


def distinct_runs(run_dirs: list[str]) -> tuple[list[str], list[str]]:
    """The run dirs in order, each once (by its resolved path), and those given again."""
    seen: dict[Path, str] = {}
    again = []
    for d in run_dirs:
        key = Path(d).expanduser().resolve()
        if key in seen:
            again.append(d)
        else:
            seen[key] = d
    return list(seen.values()), again


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [d for d in args.run_dirs if not Path(d).is_dir()]
    if missing:
        print(f"error: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    args.run_dirs, again = distinct_runs(args.run_dirs)
    if again:
        print(f"note: given more than once, read once: {', '.join(again)}", file=sys.stderr)
    out_dir = args.out or Path(args.run_dirs[0]) / "analysis"
    inside = inside_records(out_dir) if args.out is not None else ""
    if inside:
        print(
            f"error: --out {out_dir}: {inside}: the outputs would be read back as records. "
            f"Fix: --out <RUN>/analysis (the default), or a folder outside the run",
            file=sys.stderr,
        )
        return 2
    wants_wandb = args.wandb or args.wandb_report
    no_key = wandb_key_problem(args.wandb_mode, os.environ, Path.home()) if wants_wandb else ""
    if no_key:  # said before the analysis runs, not after
        print(f"error: {no_key}", file=sys.stderr)
        return 2
    problem = out_dir_problem(out_dir, given=args.out is not None)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    def progress(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    slo = {
        k: v
        for k, v in (("ttft_ms", args.slo_ttft_ms), ("tpot_ms", args.slo_tpot_ms))
        if v is not None
    }
    try:
        out = run_analysis(args.run_dirs, out_dir, progress=progress, slo=slo)
    except SchemaVersionError as err:  # a record of a newer pdbench: refused, named
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.details:
        print("\n".join(out.summary["answer"]))
    else:
        print("\n".join(card_lines(out.summary["cards"])))
    if not args.quiet:  # about the records: said whatever else is shown
        for note in out.summary["notes"]:
            print(f"note: {note}")
    if args.details and not args.quiet:
        for a in out.ctx.deployments():
            for note in a.notes:
                print(f"note: {a.label}: {note}")
        if not len(out.data.bench):
            print(
                "note: no transfer-bench records (<run>/transfer_bench/*.json); pass a bench "
                "run dir too for bandwidth plots"
            )
    if not args.details and not args.quiet:
        print("details: python -m analysis ... --details, or the report:")
    print(f"report: {out.report}")
    if out.policy:
        print(f"policy: {out.policy}")
    if args.wandb or args.wandb_report:
        msg = log_to_wandb(
            out,
            mode=args.wandb_mode,
            project=args.wandb_project,
            entity=args.wandb_entity,
            build_report=args.wandb_report,
        )
        print(msg)
    if out.data.corrupt and not args.skip_corrupt:
        print(
            f"error: {len(out.data.corrupt)} corrupt record(s), named above; the analysis left "
            "them out (rerun with --skip-corrupt to accept that)",
            file=sys.stderr,
        )
        return CORRUPT
    return 0 if len(out.data.points) else 1


if __name__ == "__main__":
    sys.exit(main())
