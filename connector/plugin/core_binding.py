"""Undo vLLM-CPU's NIXL core reservation, which piles P and D onto one core.

vLLM 0.32's NIXL worker, on CPU builds, moves the worker thread to the last core of each
NUMA node ("reserve different cores for start_load_kv() from model_forward()"). The worker
thread is also the OMP thread that runs the forward pass, and the threads NIXL starts
right after (its busy-polling UCX progress thread among them) inherit that core. With one
P and one D on a host, both servers' forward passes and both progress threads end up on
the same last core while the cores the deployment bound them to stay idle: measured on a
2-core host, ITL 20-30 ms instead of 7-9 ms, and seconds-long TTFT stalls.

``CoreBinding`` records the worker thread's cores before the connector starts;
``restore`` puts the worker thread back on them and lets the threads the connector
started run on every core the instance's process may use. GPU builds never move the
thread, so nothing changes there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TASK_DIR = "/proc/self/task"


def thread_ids() -> set[int]:
    """The ids of this process's threads (empty where /proc is absent)."""
    try:
        return {int(t) for t in os.listdir(TASK_DIR)}
    except OSError:
        return set()


@dataclass(frozen=True)
class CoreBinding:
    """The calling thread's cores and the process's threads, taken before the connector."""

    cores: frozenset[int]
    threads: frozenset[int]

    @classmethod
    def capture(cls) -> CoreBinding | None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        return cls(frozenset(os.sched_getaffinity(0)), frozenset(thread_ids()))


@dataclass(frozen=True)
class Restored:
    """What ``restore`` did, for the server log."""

    moved_to: frozenset[int]
    worker_cores: frozenset[int]
    helper_threads: tuple[int, ...]
    helper_cores: frozenset[int]

    @property
    def moved(self) -> bool:
        return self.moved_to != self.worker_cores

    def describe(self) -> str:
        """One log line; tests read its ``worker thread on cores [...]`` part."""
        head = f"worker thread on cores {sorted(self.worker_cores)}"
        if not self.moved:
            return f"{head} (vLLM left it there)"
        return (
            f"{head} (vLLM had moved it to {sorted(self.moved_to)}); connector threads "
            f"{list(self.helper_threads)} may run on {sorted(self.helper_cores)}"
        )


def helper_cores(worker_cores: frozenset[int], parent_cores: frozenset[int]) -> frozenset[int]:
    """Cores for the connector's own threads: the parent process's (the instance's share of
    the host), never fewer than the worker's."""
    return frozenset(parent_cores | worker_cores)


def restore(before: CoreBinding | None) -> Restored | None:
    """Undo a core move the connector made (``moved`` says whether it made one); None
    where threads have no affinity (not Linux)."""
    if before is None:
        return None
    now = frozenset(os.sched_getaffinity(0))
    if now == before.cores:
        return Restored(now, before.cores, (), before.cores)
    os.sched_setaffinity(0, before.cores)
    try:
        parent = frozenset(os.sched_getaffinity(os.getppid()))
    except OSError:
        parent = frozenset()
    cores = helper_cores(before.cores, parent)
    moved = []
    for tid in sorted(thread_ids() - before.threads):
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # the thread ended meanwhile
            continue
        moved.append(tid)
    return Restored(now, before.cores, tuple(moved), cores)
