"""On CUDA a step is timed where the GPU finishes it, not where it was launched: the clock
the plugin's StepTimer uses (``connector.plugin.device_clock``) against a real kernel."""

from __future__ import annotations

import threading
import time

import pytest

from connector.plugin.device_clock import CudaClock, device_clock

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def test_a_mark_resolves_when_the_gpu_has_done_the_work_before_it():
    a = torch.randn(8192, 8192, device="cuda")
    torch.cuda.synchronize()
    clock = device_clock()
    assert isinstance(clock, CudaClock)  # torch is initialised on CUDA here
    start = clock.mark()
    launched_at = time.time()
    for _ in range(20):  # ~20 x 1 TFLOP: tens of milliseconds on any GPU
        a = a @ a / 8192.0
    end = clock.mark()
    returned_at = time.time()  # the launch returned long before the work is done
    got: list[float] = []
    done = threading.Event()
    clock.when_done([start, end], lambda at: (got.extend(at), done.set()))
    assert done.wait(60)
    torch.cuda.synchronize()
    finished_at = time.time()
    started, ended = got
    assert started <= launched_at + 0.01  # the GPU was idle: it started at once
    assert ended > returned_at + 0.005  # the end is the GPU's, after the launch returned
    assert ended <= finished_at + 0.005
