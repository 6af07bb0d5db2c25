"""Per-request timing inside a vLLM server, from the KV connector's hooks (no vLLM import).

vLLM keeps each request's queue and prefill times only as Prometheus histograms; the
connector's hooks see every request on its way through the scheduler, so pdbench's plugin
(``connector.plugin.vllm_plugin``) records them per request, keyed by vLLM's request id (which
holds the router's ``X-Request-Id``). Clock: ``time.time()`` of the server's host, in every
process of the server (API server, engine core, workers); only differences within one
server are used.

Scheduler side (``RequestTimer``, in the engine core): one line per request, written when
the step that computes its last prompt token is scheduled, to
``$PDBENCH_TIMING_DIR/sched-<pid>.jsonl``:

=============  =========================================================================
request_id     vLLM's id: ``cmpl-<X-Request-Id>-<n>-<random>`` (``external_id`` strips it)
arrival_s      the API server accepted it (``Request.arrival_time``)
queued_s       the scheduler got it (``on_new_request``)
load_s         blocks allocated for a KV load from the peer (``update_state_after_alloc``
               with external tokens); -1: no load
load_tokens    tokens whose KV it loads from the peer (0: none)
loaded_s       the peer's KV arrived (``finished_recving``); -1: no load
scheduled_s    the first step that computes part of its prompt was scheduled
step           the step that computes its last prompt token (its first output token)
prompt_tokens  tokens in the prompt; ``computed_tokens``: those computed here
=============  =========================================================================

Worker side (``StepTimer``, each worker): for every step the scheduler marked (one that
completes a prompt), one line to ``$PDBENCH_TIMING_DIR/worker<rank>-<pid>.jsonl``:
``step``, ``forward_start_s`` (the step's metadata bound, before the forward) and
``forward_end_s`` (``wait_for_save``: the forward is done), each where the device got there
(``connector.plugin.device_clock``: on CUDA ``wait_for_save`` runs once the forward is only
launched; a CUDA event marks it and the line is written when the GPU has passed it). The
first token of a request is computed by the forward of its ``step``; sampling and the
answer's way out come after.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector.plugin.device_clock import device_clock
from connector.plugin.transfer_trace import JsonLines
from connector.process_env import TIMING_DIR_ENV

logger = logging.getLogger("vllm.pdbench.timing")

STEP_ATTRIBUTE = "pdbench_step"  # set on the connector metadata of a marked step

_INTERNAL_ID = re.compile(r"^(?:cmpl-)?(?P<external>.+?)-\d+(?:-[0-9a-zA-Z]{8})?$")


def external_id(request_id: str) -> str:
    """The ``X-Request-Id`` a vLLM completion request id was made from."""
    match = _INTERNAL_ID.match(request_id)
    return match.group("external") if match else request_id


@dataclass
class _Open:
    """What is known of a request whose first token has not been scheduled yet."""

    arrival_s: float
    queued_s: float
    prompt_tokens: int
    load_s: float = -1.0
    load_tokens: int = 0
    loaded_s: float = -1.0
    scheduled_s: float = -1.0
    computed_tokens: int = 0


class RequestTimer:
    """Scheduler-side timing of every request (see the module docstring)."""

    def __init__(self, write: Callable[[dict[str, Any]], None], clock=time.time) -> None:
        self.write = write
        self.clock = clock
        self.open: dict[str, _Open] = {}
        self.step = 0

    def new_request(self, request: Any) -> None:
        self.open[request.request_id] = _Open(
            arrival_s=float(request.arrival_time),
            queued_s=self.clock(),
            prompt_tokens=int(request.num_prompt_tokens),
        )

    def allocated(self, request_id: str, external_tokens: int) -> None:
        entry = self.open.get(request_id)
        if entry is not None and external_tokens > 0 and entry.load_s < 0:
            entry.load_s, entry.load_tokens = self.clock(), int(external_tokens)

    def loaded(self, request_ids: Iterable[str]) -> None:
        now = self.clock()
        for request_id in request_ids:
            entry = self.open.get(request_id)
            if entry is not None and entry.loaded_s < 0:
                entry.loaded_s = now

    def scheduled(
        self, num_scheduled_tokens: dict[str, int], computed: dict[str, int]
    ) -> int | None:
        """One step scheduled: ``num_scheduled_tokens`` per request and the tokens each had
        computed before it. Returns the step's id when it completes a prompt (the worker
        times that step), else None."""
        self.step += 1
        now = self.clock()
        completes = False
        for request_id, n in num_scheduled_tokens.items():
            entry = self.open.get(request_id)
            if entry is None or n <= 0:
                continue
            if entry.scheduled_s < 0:
                entry.scheduled_s = now
            entry.computed_tokens += n
            if computed.get(request_id, 0) + n >= entry.prompt_tokens:
                completes = True
                del self.open[request_id]
                self.write({"request_id": request_id, "step": self.step, **entry.__dict__})
        return self.step if completes else None

    def finished(self, request_id: str) -> None:
        """A request that ends before its first token (aborted, failed) leaves no line."""
        self.open.pop(request_id, None)


class StepTimer:
    """Worker-side timing of the steps the scheduler marked: where the device reached the
    step's start and its end (``connector.plugin.device_clock``: on CUDA the forward is only
    launched when ``wait_for_save`` runs; its line is written once the GPU has done it)."""

    def __init__(self, write: Callable[[dict[str, Any]], None], clock: Any = None) -> None:
        self.write = write
        self.clock = clock if clock is not None else device_clock()
        self.current: tuple[int, Any] | None = None

    def bound(self, metadata: Any) -> None:
        step = getattr(metadata, STEP_ATTRIBUTE, None)
        self.current = (int(step), self.clock.mark()) if step is not None else None

    def saved(self) -> None:
        if self.current is not None:
            step, start = self.current
            self.current = None
            self.clock.when_done([start, self.clock.mark()], lambda at: self._line(step, at))

    def _line(self, step: int, at: list[float]) -> None:
        self.write({"step": step, "forward_start_s": at[0], "forward_end_s": at[1]})


def timing_dir(environ=None) -> str:
    return (os.environ if environ is None else environ).get(TIMING_DIR_ENV, "")


def _guarded(fn: Callable[[], Any]) -> Any:
    """Timing must never break serving: a failure is logged once per kind and dropped."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - logged, and serving goes on
        key = type(exc).__name__
        if key not in _guarded.seen:
            _guarded.seen.add(key)
            logger.warning("pdbench request timing disabled for one event: %r", exc)
        return None


_guarded.seen = set()


class RequestTimingMixin:
    """Mixed into pdbench's NixlConnector (before vLLM's class): times every request on the
    scheduler side and marked steps on the worker side when ``$PDBENCH_TIMING_DIR`` is set."""

    _pdbench_timer: RequestTimer | None = None
    _pdbench_steps: StepTimer | None = None
    _pdbench_dir: str | None = None  # $PDBENCH_TIMING_DIR, read once

    def _timing_dir(self) -> str:
        if self._pdbench_dir is None:
            self._pdbench_dir = timing_dir()
        return self._pdbench_dir

    def _timer(self) -> RequestTimer | None:
        if self._pdbench_timer is None and self._timing_dir():
            path = Path(self._timing_dir()) / f"sched-{os.getpid()}.jsonl"
            self._pdbench_timer = RequestTimer(JsonLines(path))
        return self._pdbench_timer

    def _steps(self) -> StepTimer | None:
        if self._pdbench_steps is None and self._timing_dir():
            rank = getattr(getattr(self, "connector_worker", None), "tp_rank", 0)
            path = Path(self._timing_dir()) / f"worker{rank}-{os.getpid()}.jsonl"
            self._pdbench_steps = StepTimer(JsonLines(path))
        return self._pdbench_steps

    # ---- scheduler side ----
    def on_new_request(self, request):
        super().on_new_request(request)
        if (timer := self._timer()) is not None:
            _guarded(lambda: timer.new_request(request))

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        out = super().update_state_after_alloc(request, blocks, num_external_tokens)
        if (timer := self._timer()) is not None:
            _guarded(lambda: timer.allocated(request.request_id, num_external_tokens))
        return out

    def update_connector_output(self, connector_output):
        super().update_connector_output(connector_output)
        if (timer := self._timer()) is not None:
            _guarded(lambda: timer.loaded(connector_output.finished_recving or ()))

    def build_connector_meta(self, scheduler_output):
        meta = super().build_connector_meta(scheduler_output)
        timer = self._timer()
        if timer is not None and not timer.open:
            timer.step += 1  # no prompt awaits its first token (most decode steps): no view
        elif timer is not None:
            step = _guarded(lambda: timer.scheduled(*_step_view(timer.open, scheduler_output)))
            if step is not None:
                setattr(meta, STEP_ATTRIBUTE, step)
        return meta

    def request_finished(self, request, block_ids):
        out = super().request_finished(request, block_ids)
        if (timer := self._timer()) is not None:
            _guarded(lambda: timer.finished(request.request_id))
        return out

    def request_finished_all_groups(self, request, block_ids):
        """What vLLM's scheduler calls (0.32 and 0.33: ``request_finished`` is then never
        called), so a request aborted before its first token leaves no entry behind."""
        out = super().request_finished_all_groups(request, block_ids)
        if (timer := self._timer()) is not None:
            _guarded(lambda: timer.finished(request.request_id))
        return out

    # ---- worker side ----
    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if (steps := self._steps()) is not None:
            _guarded(lambda: steps.bound(connector_metadata))

    def wait_for_save(self):
        super().wait_for_save()
        if (steps := self._steps()) is not None:
            _guarded(steps.saved)


def _step_view(
    open_ids: Iterable[str], scheduler_output: Any
) -> tuple[dict[str, int], dict[str, int]]:
    """Tokens scheduled in this step per request of ``open_ids`` (those awaiting their first
    token), and the tokens each had computed before it (the scheduler updates
    ``num_computed_tokens`` after building the metadata)."""
    scheduled_all = scheduler_output.num_scheduled_tokens
    scheduled = {rid: scheduled_all[rid] for rid in open_ids if rid in scheduled_all}
    computed: dict[str, int] = {}
    for new in scheduler_output.scheduled_new_reqs:
        if new.req_id in scheduled:
            computed[new.req_id] = int(new.num_computed_tokens)
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, n in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
        if req_id in scheduled:
            computed[req_id] = int(n)
    return scheduled, computed
