"""An engine that only holds KV blocks for a peer waits for work between steps on CPU; one
with anything to run, or to wait for KV for, keeps vLLM's loop."""

from __future__ import annotations

import queue

import pytest

from connector.plugin.engine_idle import CPU_WAIT_MS, describe, idle_wait_ms, install, only_leases
from connector.process_env import ENGINE_IDLE_WAIT_ENV

pytestmark = pytest.mark.unit


def test_cpu_servers_wait_gpu_servers_keep_vllms_loop():
    assert idle_wait_ms({}, on_cpu=True) == CPU_WAIT_MS > 1  # longer than vLLM's 1 ms sleep
    assert idle_wait_ms({}, on_cpu=False) is None


@pytest.mark.parametrize("on_cpu", [True, False])
def test_the_environment_sets_it_on_either_platform(on_cpu):
    assert idle_wait_ms({ENGINE_IDLE_WAIT_ENV: "0"}, on_cpu) == 0
    assert idle_wait_ms({ENGINE_IDLE_WAIT_ENV: " 25 "}, on_cpu) == 25


@pytest.mark.parametrize("given", ["-1", "2.5", "10ms"])
def test_a_bad_value_names_the_variable_and_what_it_takes(given):
    with pytest.raises(ValueError, match=f"{ENGINE_IDLE_WAIT_ENV}=.*whole milliseconds"):
        idle_wait_ms({ENGINE_IDLE_WAIT_ENV: given}, on_cpu=True)


def test_the_log_line_says_which_loop_runs():
    assert "waits up to 10 ms" in describe(10)
    assert "vLLM's own loop" in describe(0) and "vLLM's own loop" in describe(None)


class Scheduler:
    def __init__(self, unfinished: int, finished: int):
        self.unfinished, self.finished = unfinished, finished

    def has_unfinished_requests(self) -> bool:
        return self.unfinished > 0

    def has_finished_requests(self) -> bool:
        return self.finished > 0


class Inbox(queue.Queue):
    """The engine's input queue, remembering how long each get was allowed to block."""

    def __init__(self):
        super().__init__()
        self.timeouts: list[float | None] = []

    def get(self, block=True, timeout=None):
        self.timeouts.append(timeout)
        return super().get(block=False)  # never block a unit test: empty -> queue.Empty


def engine_class():
    """The part of vLLM's EngineCoreProc the patch relies on."""

    class Engine:
        def __init__(self, scheduler: Scheduler, executed: bool):
            self.scheduler, self.executed = scheduler, executed
            self.input_queue = Inbox()
            self.handled: list[tuple] = []
            self.steps = 0

        def _process_engine_step(self) -> bool:
            self.steps += 1
            return self.executed

        def _handle_client_request(self, *request) -> None:
            self.handled.append(request)

    return Engine


def test_an_empty_step_with_only_leases_waits_for_the_next_request_and_handles_it():
    cls = engine_class()
    assert install(cls, 50)
    engine = cls(Scheduler(unfinished=0, finished=2), executed=False)
    assert engine._process_engine_step() is False
    assert engine.steps == 1 and engine.input_queue.timeouts == [0.05]  # nothing came
    engine.input_queue.put(("ADD", "req-1"))
    engine._process_engine_step()
    assert engine.handled == [("ADD", "req-1")]  # handled at once, as vLLM's loop would


@pytest.mark.parametrize(
    ("scheduler", "executed"),
    [
        (Scheduler(unfinished=1, finished=2), False),  # a request waiting for a peer's KV
        (Scheduler(unfinished=1, finished=0), True),  # decoding
        (Scheduler(unfinished=0, finished=1), True),  # the step that finished a request
        (Scheduler(unfinished=0, finished=0), False),  # nothing held: vLLM blocks itself
    ],
)
def test_anything_else_keeps_vllms_loop(scheduler, executed):
    cls = engine_class()
    install(cls, 50)
    engine = cls(scheduler, executed)
    assert engine._process_engine_step() is executed
    assert engine.input_queue.timeouts == []


def test_only_leases_means_finished_requests_and_nothing_else():
    assert only_leases(Scheduler(unfinished=0, finished=1))
    assert not only_leases(Scheduler(unfinished=1, finished=1))


def test_no_wait_asked_or_another_engine_is_left_alone():
    cls = engine_class()
    step = cls._process_engine_step
    assert not install(cls, 0) and not install(cls, None)
    assert cls._process_engine_step is step
    assert install(cls, 50) and install(cls, 10)  # once: the first wait holds
    engine = cls(Scheduler(unfinished=0, finished=1), executed=False)
    engine._process_engine_step()
    assert engine.input_queue.timeouts == [0.05]

    class Other:  # a vLLM without the methods the patch wraps
        def _process_engine_step(self) -> bool:
            return False

    assert not install(Other, 10)


def test_vllms_engine_core_has_what_the_patch_wraps():
    core = pytest.importorskip("vllm.v1.engine.core")

    class Engine(core.EngineCoreProc):  # a subclass: vLLM's own class stays unpatched here
        pass

    assert install(Engine, 10)
    assert "_pdbench_idle_wait_s" not in vars(core.EngineCoreProc)
