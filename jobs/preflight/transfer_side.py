"""One side of the transfer preflight's read, as its own process (``jobs.preflight.transfer``).

``python -m jobs.preflight.transfer_side PROBE.json owner|reader WORK_DIR``: the owner (P's
device) or the reader (D's device) of a one-case transfer bench (``connector.bench.runner``); the
reader writes its record to ``WORK_DIR/record.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from connector.bench.runner import OWNER, READER, run_bench_task
from connector.shared_files import write_json_atomic
from jobs.preflight.transfer import JOB_ID, RECORD
from pdbench.spec.transfer_probe import TransferProbe, bench_spec


def main(argv: list[str] | None = None) -> int:
    """Run the side ``argv`` names; 0 once it ran (a failed read is in the record)."""
    parser = argparse.ArgumentParser(prog="python -m jobs.preflight.transfer_side")
    parser.add_argument("probe")
    parser.add_argument("role", choices=[OWNER, READER])
    parser.add_argument("work")
    args = parser.parse_args(argv)
    probe = TransferProbe.from_dict(json.loads(Path(args.probe).read_text()))
    work = Path(args.work)

    def sink(record: dict) -> None:
        write_json_atomic(work / RECORD, record)

    run_bench_task(bench_spec(probe), 0 if args.role == OWNER else 1, work, JOB_ID, sink)
    return 0


if __name__ == "__main__":
    sys.exit(main())
