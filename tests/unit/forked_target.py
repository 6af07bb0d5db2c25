"""What ``tests/unit/test_forker.py`` forks: ``python -m tests.unit.forked_target ACTION``
says what it was given (one JSON line), then exits 3 (``exit3``), sleeps (``sleep``) or
returns (anything else). Imported, it prints what a reply of the forker looks like."""

from __future__ import annotations

import json
import os
import sys
import time

if __name__ != "__main__":  # imported by the forker: what it prints must not pass for a reply
    print(json.dumps({"id": 0, "pid": 1}), flush=True)


def main() -> None:
    action = sys.argv[1]
    said = {
        "argv": sys.argv[1:],
        "name": __name__,
        "given": os.environ.get("TARGET_GIVEN"),
        "forker_only": os.environ.get("FORKER_ONLY"),
        "own_session": os.getsid(0) == os.getpid(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "stdin": os.readlink("/proc/self/fd/0"),
        "parent": os.getppid(),
    }
    print(json.dumps(said), flush=True)
    if action == "exit3":
        sys.exit(3)
    if action == "sleep":
        time.sleep(600)


if __name__ == "__main__":
    main()
