"""``python -m jobs.preflight --spec SPEC.json [--rendezvous DIR] [--report FILE]``.

Runs this node's preflight (rank from the task's environment: SLURM, submitit, or 0) and
prints one line per check; exits 1 when a check failed, the failed lines last. The spec is
``PreflightSpec.to_dict()`` as JSON (``spec_from_config`` builds it from a RunConfig); with
several nodes, start one task per node with the same fresh ``--rendezvous`` directory (e.g.
``srun --ntasks-per-node=1``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jobs.preflight.runner import run_preflight
from jobs.preflight.spec import PreflightSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.preflight", description=__doc__)
    parser.add_argument("--spec", required=True, help="PreflightSpec JSON file")
    parser.add_argument("--rendezvous", default=None, help="shared dir for the cross-node checks")
    parser.add_argument("--rank", type=int, default=None, help="default: the task's rank")
    parser.add_argument("--report", default=None, help="also write the report JSON here")
    parser.add_argument("--peer-timeout-s", type=float, default=120.0)
    args = parser.parse_args(argv)
    spec = PreflightSpec.from_dict(json.loads(Path(args.spec).read_text()))
    report = run_preflight(spec, args.rank, args.rendezvous, peer_timeout_s=args.peer_timeout_s)
    for line in report.lines():
        print(line, flush=True)
    if args.report:
        Path(args.report).write_text(json.dumps(report.to_dict(), indent=1))
    for line in report.failure_lines():
        print(line, file=sys.stderr, flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
