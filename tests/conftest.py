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
