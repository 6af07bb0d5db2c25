import json
import os
from types import SimpleNamespace

import pytest

from connector.plugin.device_clock import HostClock
from connector.plugin.request_timing import (
    STEP_ATTRIBUTE,
    RequestTimer,
    RequestTimingMixin,
    StepTimer,
    external_id,
)
from jobs.measure import ttft_split
from jobs.serving.router import TurnTiming
from jobs.serving.router_headers import format_spans, parse_spans
from records.point import RequestRecord

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def record(ttft_ms, spans, rid="pdb-x-t2-abc", turn=2):
    return RequestRecord(
        conversation=0,
        turn=turn,
        flow="pull",
        prompt_tokens=100,
        history_tokens=60,
        output_token_ids=[1],
        ttft_ms=ttft_ms,
        itl_ms=[],
        e2e_ms=ttft_ms,
        start_s=0.0,
        request_id=rid,
        router_spans_ms=spans,
    )


def test_external_id_strips_what_vllm_adds():
    assert external_id("cmpl-pdb-pull-h64-r0-abc-t2-0123456789ab-p-0-1a2b3c4d") == (
        "pdb-pull-h64-r0-abc-t2-0123456789ab-p"
    )
    assert external_id("cmpl-pdb-x-t1-ff-d-0") == "pdb-x-t1-ff-d"


def test_request_timer_writes_one_line_when_the_last_prompt_token_is_scheduled():
    lines, clock = [], Clock()
    timer = RequestTimer(lines.append, clock)
    request = SimpleNamespace(request_id="r1", arrival_time=999.5, num_prompt_tokens=100)
    timer.new_request(request)
    clock.t = 1000.1
    timer.allocated("r1", 64)  # a KV load of 64 tokens from the peer
    assert timer.scheduled({}, {}) is None  # waiting for the load: not in the step
    clock.t = 1000.3
    timer.loaded(["r1"])
    clock.t = 1000.4
    assert timer.scheduled({"r1": 20}, {"r1": 64}) is None  # a chunk: prompt not done
    clock.t = 1000.5
    step = timer.scheduled({"r1": 16}, {"r1": 84})
    assert step == 3 and lines and timer.open == {}
    (line,) = lines
    assert line["request_id"] == "r1" and line["step"] == 3
    assert (line["arrival_s"], line["queued_s"], line["load_s"]) == (999.5, 1000.0, 1000.1)
    assert (line["loaded_s"], line["scheduled_s"]) == (1000.3, 1000.4)
    assert line["load_tokens"] == 64 and line["computed_tokens"] == 36


def test_step_timer_times_only_marked_steps():
    lines, clock = [], Clock()
    steps = StepTimer(lines.append, HostClock(clock))
    steps.bound(SimpleNamespace())
    steps.saved()
    assert lines == []
    steps.bound(SimpleNamespace(**{STEP_ATTRIBUTE: 7}))
    clock.t += 0.25
    steps.saved()
    assert lines == [{"step": 7, "forward_start_s": 1000.0, "forward_end_s": 1000.25}]


class LaterDevice:
    """A device that runs behind the host, as CUDA does: a mark is done when ``run`` says
    so (the GPU reached it), and only then is its time known."""

    asynchronous = True

    def __init__(self) -> None:
        self.marks, self.waiting = 0, []

    def mark(self) -> int:
        self.marks += 1
        return self.marks

    def when_done(self, marks, then) -> None:
        self.waiting.append((marks, then))

    def run(self, done_at: dict[int, float]) -> None:
        for marks, then in self.waiting:
            then([done_at[m] for m in marks])
        self.waiting = []


def test_a_step_on_an_asynchronous_device_is_timed_where_its_work_ends():
    """wait_for_save runs once the forward is launched: the line waits for the device and
    carries its times, not the launch's (the GPU tier checks CudaClock on a real GPU)."""
    lines, device = [], LaterDevice()
    steps = StepTimer(lines.append, device)
    steps.bound(SimpleNamespace(**{STEP_ATTRIBUTE: 3}))
    steps.saved()  # the forward was launched: nothing known yet
    assert lines == []
    device.run({1: 1000.002, 2: 1000.180})  # the GPU started it at .002, finished at .180
    assert lines == [{"step": 3, "forward_start_s": 1000.002, "forward_end_s": 1000.180}]


def test_router_spans_round_trip_through_the_header():
    t = TurnTiming(received=10.0, p_sent=10.001, p_answered=10.2, d_sent=10.2015, d_first=10.3)
    spans = parse_spans(format_spans(t.spans_ms()))
    assert spans == pytest.approx({"route": 1.0, "p": 199.0, "gap": 1.5, "d": 98.5}, abs=1e-3)
    agg = TurnTiming(received=10.0, d_sent=10.002, d_first=10.05).spans_ms()
    assert agg["p"] == agg["gap"] == 0 and agg["route"] == pytest.approx(2.0)
    assert parse_spans("route=1;junk;p=x") == {"route": 1.0}


def pd_case():
    # P: accepted at 0, blocks for a pull at 0.010, scheduled at 0.050, forward done 0.150
    p = ttft_split.ServerTiming(arrival_s=0.0, scheduled_s=0.050, first_token_s=0.150, load_s=0.010)
    # D: accepted at 5.000 (its own clock), its KV read done, scheduled 5.030, forward 5.060
    d = ttft_split.ServerTiming(arrival_s=5.0, scheduled_s=5.030, first_token_s=5.060, load_s=5.002)
    spans = {"route": 0.5, "p": 170.0, "gap": 1.0, "d": 80.0}
    return record(260.0, spans), p, d


def test_per_request_parts_add_up_and_the_residual_is_measured():
    r, p, d = pd_case()
    parts, residual = ttft_split.split_per_request(r, p, d)
    assert list(parts) == list(ttft_split.PARTS)
    assert sum(parts.values()) == pytest.approx(r.ttft_ms)
    assert parts["router_ms"] == 0.5
    assert parts["p_queue_ms"] == pytest.approx(10.0)
    assert parts["p_pull_ms"] == pytest.approx(40.0)
    assert parts["p_compute_ms"] == pytest.approx(100.0)
    assert parts["handoff_ms"] == pytest.approx(1.0 + 30.0)
    assert parts["d_first_step_ms"] == pytest.approx(30.0)
    # the residual is exactly client <-> router + P's and D's time outside their engines
    assert residual == pytest.approx({"client_ms": 8.5, "p_http_ms": 20.0, "d_http_ms": 20.0})
    assert parts["residual_ms"] == pytest.approx(sum(residual.values()))


def test_agg_has_no_p_parts_and_a_missing_line_falls_back_to_the_wave():
    d = ttft_split.ServerTiming(arrival_s=1.0, scheduled_s=1.004, first_token_s=1.044)
    r = record(50.0, {"route": 0.4, "p": 0.0, "gap": 0.0, "d": 47.0})
    parts, _ = ttft_split.split_per_request(r, None, d)
    assert parts["p_queue_ms"] == parts["p_compute_ms"] == parts["handoff_ms"] == 0
    assert parts["d_first_step_ms"] == pytest.approx(44.0)
    assert sum(parts.values()) == pytest.approx(50.0)
    rp, _, d = pd_case()
    assert ttft_split.split_per_request(rp, None, d) is None  # P's line is missing


def test_per_wave_means_from_histogram_deltas():
    deltas = {
        "prefill0": {
            "vllm:request_queue_time_seconds_sum": 0.12,
            "vllm:request_queue_time_seconds_count": 2,
            "vllm:request_prefill_time_seconds_sum": 0.2,
            "vllm:request_prefill_time_seconds_count": 2,
            "vllm:nixl_xfer_time_seconds_sum": 0.02,
        },
        "decode0": {
            "vllm:request_queue_time_seconds_sum": 0.06,
            "vllm:request_queue_time_seconds_count": 2,
            "vllm:request_prefill_time_seconds_sum": 0.04,
            "vllm:request_prefill_time_seconds_count": 2,
        },
    }
    wave = ttft_split.WaveTiming.from_deltas(deltas, ["prefill0"], ["decode0"])
    assert wave.p_queue_s == pytest.approx(0.06) and wave.p_xfer_s == pytest.approx(0.01)
    r = record(200.0, {"route": 1.0, "p": 120.0, "gap": 2.0, "d": 60.0})
    records = [r, record(90.0, {"route": 1.0, "p": 0.0, "gap": 0.0, "d": 80.0}, rid="")]
    ttft_split.apply(records, {}, {2: wave})
    assert r.split_source == ttft_split.PER_WAVE
    assert r.ttft_split["p_pull_ms"] == pytest.approx(10.0)
    assert r.ttft_split["p_queue_ms"] == pytest.approx(50.0)
    assert r.ttft_split["handoff_ms"] == pytest.approx(2.0 + 30.0)
    assert sum(r.ttft_split.values()) == pytest.approx(200.0)
    agg = records[1]
    assert agg.ttft_split["d_first_step_ms"] == pytest.approx(50.0)
    assert sum(agg.ttft_split.values()) == pytest.approx(90.0)


def test_server_lines_are_joined_by_the_routers_id(tmp_path):
    r, *_ = pd_case()
    p_dir, d_dir = tmp_path / "prefill0", tmp_path / "decode0"
    p_dir.mkdir()
    d_dir.mkdir()
    rid = r.request_id

    def write(path, rows):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"torn')

    sched = {"arrival_s": 0.0, "queued_s": 0.001, "scheduled_s": 0.05, "load_s": 0.01}
    write(p_dir / "sched-1.jsonl", [{"request_id": f"cmpl-{rid}-p-0-abcdef12", "step": 4, **sched}])
    write(p_dir / "worker0-2.jsonl", [{"step": 4, "forward_start_s": 0.06, "forward_end_s": 0.15}])
    d_sched = {"arrival_s": 5.0, "queued_s": 5.0, "scheduled_s": 5.03, "load_s": 5.002}
    rows = [{"request_id": f"cmpl-{rid}-d-0-12345678", "step": 9, **d_sched}]
    rows.append({"request_id": "cmpl-other-d-0-12345678", "step": 10, **d_sched})
    write(d_dir / "sched-3.jsonl", rows)
    write(d_dir / "worker0-4.jsonl", [{"step": 9, "forward_start_s": 5.04, "forward_end_s": 5.06}])
    servers = ttft_split.read_server_timing(tmp_path, ttft_split.wanted_ids([r]))
    assert set(servers) == {f"{rid}-p", f"{rid}-d"}
    assert servers[f"{rid}-p"].first_token_s == 0.15
    ttft_split.apply([r], servers, {})
    assert r.split_source == ttft_split.PER_REQUEST
    assert r.ttft_split["p_compute_ms"] == pytest.approx(100.0)
    assert sum(r.ttft_split.values()) == pytest.approx(r.ttft_ms)


def test_the_connector_marks_the_step_that_completes_a_prompt_and_skips_idle_ones(
    tmp_path, monkeypatch
):
    class VllmSide:  # what vLLM's connector returns from its scheduler hooks
        def on_new_request(self, request):
            pass

        def build_connector_meta(self, scheduler_output):
            return SimpleNamespace()

    class Connector(RequestTimingMixin, VllmSide):
        pass

    monkeypatch.setenv("PDBENCH_TIMING_DIR", str(tmp_path))
    conn = Connector()

    def step(scheduled: dict[str, int], computed: dict[str, int]):
        cached = SimpleNamespace(
            req_ids=list(computed), num_computed_tokens=list(computed.values())
        )
        out = SimpleNamespace(
            num_scheduled_tokens=scheduled, scheduled_new_reqs=[], scheduled_cached_reqs=cached
        )
        return conn.build_connector_meta(out)

    assert not hasattr(step({"other": 1}, {"other": 40}), STEP_ATTRIBUTE)  # decode only
    request = SimpleNamespace(request_id="cmpl-a-0-1a2b3c4d", arrival_time=1.0, num_prompt_tokens=8)
    conn.on_new_request(request)
    assert not hasattr(step({"cmpl-a-0-1a2b3c4d": 4, "other": 1}, {"other": 41}), STEP_ATTRIBUTE)
    meta = step({"cmpl-a-0-1a2b3c4d": 4, "other": 1}, {"cmpl-a-0-1a2b3c4d": 4, "other": 42})
    assert getattr(meta, STEP_ATTRIBUTE) == 3  # steps count from the first, idle ones included
    (line,) = (tmp_path / f"sched-{os.getpid()}.jsonl").read_text().splitlines()
    assert json.loads(line)["step"] == 3 and not conn._pdbench_timer.open


def test_a_request_vllm_finishes_through_all_groups_leaves_no_open_entry():
    """vLLM's scheduler finishes requests through ``request_finished_all_groups`` (0.32 and
    0.33), never ``request_finished``: an abort before the first token must close it."""

    class Connector:  # the part of vLLM's connector the mixin wraps
        def request_finished_all_groups(self, request, block_ids):
            return False, None

    class Timed(RequestTimingMixin, Connector):
        pass

    timed, lines = Timed(), []
    timed._pdbench_dir = "unused"
    timed._pdbench_timer = RequestTimer(lines.append, Clock())
    request = SimpleNamespace(request_id="r9", arrival_time=999.0, num_prompt_tokens=10)
    timed._pdbench_timer.new_request(request)
    assert timed.request_finished_all_groups(request, ([],)) == (False, None)
    assert timed._pdbench_timer.open == {} and lines == []
