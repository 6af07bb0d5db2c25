"""Loaded on pytest-xdist's controller too (tests/e2e/conftest.py is loaded only where tests
are collected, in the workers)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """On the controller, as each xdist worker reports what it collected: under ``--dist
    loadgroup`` the e2e tests carry their group in their node ids (``...::test@group``).
    None that does means the groups were dropped and each test would run beside its
    group's holders of the cluster and the smoke run (pytest 9.2 with pytest-xdist 3.8 drops
    them silently: pytest-xdist issue 1386)."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    e2e = [nodeid for nodeid in ids if nodeid.startswith("tests/e2e/")]
    if e2e and not any("@" in nodeid for nodeid in e2e):
        pytest.exit(
            f"--dist loadgroup grouped nothing (e.g. {e2e[0]}): pytest {pytest.__version__} "
            "with this pytest-xdist; install pytest<9.2 (make install)",
            returncode=3,
        )


# PDBENCH_TEST_TIMELINE=FILE: one JSON line per test (its worker, its xdist group, when its
# setup began and its teardown ended), appended by each worker; benchmarks/tier_timeline.py
# draws it per worker, so one sees which groups a worker ran when and where it waited.
_TIMELINE_STARTS: dict[str, float] = {}
_RUNS_TESTS = [True]  # False on xdist's controller


def pytest_configure(config: pytest.Config) -> None:
    """xdist's controller calls the runtest log hooks too, as each worker's reports arrive:
    only the process that runs a test records it."""
    _RUNS_TESTS[0] = hasattr(config, "workerinput") or config.getoption("dist", "no") == "no"


def pytest_runtest_logstart(nodeid: str, location) -> None:
    import time

    _TIMELINE_STARTS[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    import json
    import os
    import time

    path = os.environ.get("PDBENCH_TEST_TIMELINE") if _RUNS_TESTS[0] else None
    start = _TIMELINE_STARTS.pop(nodeid, None)
    if not path or start is None:
        return
    test, _, group = nodeid.partition("@")
    line = {
        "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
        "test": test,
        "group": group or None,
        "start": start,
        "end": time.time(),
    }
    with open(path, "a") as out:
        out.write(json.dumps(line) + "\n")
