"""Undoing vLLM-CPU's NIXL core move: the worker thread goes back, new threads may roam."""

from __future__ import annotations

import os
import threading

import pytest

from connector.plugin.core_binding import CoreBinding, helper_cores, restore

pytestmark = [
    pytest.mark.unit,
    pytest.mark.skipif(
        not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
        reason="needs Linux affinity and two usable cores",
    ),
]


def _in_thread(fn):
    """Run ``fn`` in a fresh thread (affinity changes stay inside it) and return its value."""
    box = {}

    def run():
        box["value"] = fn()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box["value"]


def test_helper_cores_never_narrower_than_the_worker():
    assert helper_cores(frozenset({0}), frozenset({0, 1, 2})) == {0, 1, 2}
    assert helper_cores(frozenset({3}), frozenset()) == {3}


def test_restore_puts_the_thread_back_and_frees_threads_started_meanwhile():
    cores = sorted(os.sched_getaffinity(0))
    bound, reserved = cores[0], cores[-1]

    def scenario():
        os.sched_setaffinity(0, {bound})  # the deployment's binding (OMP thread)
        before = CoreBinding.capture()
        os.sched_setaffinity(0, {reserved})  # what vLLM's NIXL worker does on CPU
        release = threading.Event()
        started = threading.Event()
        helper_affinity = {}

        def helper():  # a thread the connector starts: inherits the reserved core
            helper_affinity["at_start"] = os.sched_getaffinity(0)
            started.set()
            release.wait()
            helper_affinity["after"] = os.sched_getaffinity(0)

        h = threading.Thread(target=helper)
        h.start()
        started.wait()
        restored = restore(before)
        release.set()
        h.join()
        return before, restored, os.sched_getaffinity(0), helper_affinity

    before, restored, worker_now, helper_affinity = _in_thread(scenario)
    assert worker_now == {bound}
    assert helper_affinity["at_start"] == {reserved}
    assert helper_affinity["after"] == set(os.sched_getaffinity(os.getppid())) | {bound}
    assert restored is not None and restored.moved and restored.moved_to == {reserved}
    assert restored.describe().startswith(f"worker thread on cores [{bound}] (vLLM had moved")


def test_restore_does_nothing_when_nothing_moved():
    def scenario():
        before = CoreBinding.capture()
        return restore(before), os.sched_getaffinity(0)

    restored, now = _in_thread(scenario)
    assert restored is not None and not restored.moved
    assert now == os.sched_getaffinity(0)
    assert restored.describe().endswith("(vLLM left it there)")
