"""workload=trace is refused before anything starts when its trace cannot be replayed here:
each problem names the setting, the value and the fix (the largest scale that fits, the
speedup that fits a Point), and the dry run shows the trace's shape as recorded and as
replayed."""

from __future__ import annotations

import json

import pytest

from pdbench.cli import compose_job
from pdbench.traffic import examples
from pdbench.traffic.trace import TraceFormat
from pdbench.validate.rules import validate, warnings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("traces") / "chat.jsonl"
    shape = examples.ExampleShape(conversations=20, span_s=7200.0)  # two hours of traffic
    return str(examples.write_example(TraceFormat.mooncake, path, shape, 0))


def problems(*overrides: str) -> dict[str, str]:
    cfg = compose_job(["+experiment=flows", "workload=trace", *overrides])
    return {p.field: str(p) for p in validate(cfg)}


def test_a_trace_longer_than_the_context_is_refused_with_the_scale_that_fits(mooncake):
    line = problems(f"workload.trace.path={mooncake}", "workload.trace.speedup=100")[
        "workload.trace.length_scale"
    ]
    assert "over model.max_model_len (2,048)" in line
    scale = line.split("Fix: workload.trace.length_scale=")[1].split(" ")[0]
    assert 0 < float(scale) < 1
    fixed = [f"workload.trace.length_scale={scale}", "workload.trace.speedup=100"]
    assert problems(f"workload.trace.path={mooncake}", *fixed) == {}


def test_a_replay_longer_than_a_point_names_the_speedup_that_fits(mooncake):
    found = problems(f"workload.trace.path={mooncake}", "workload.trace.length_scale=0.01")
    assert list(found) == ["workload.trace.speedup"]
    speedup = found["workload.trace.speedup"].split("Fix: workload.trace.speedup=")[1].split(" ")[0]
    fixed = [
        f"workload.trace.path={mooncake}",
        "workload.trace.length_scale=0.01",
        f"workload.trace.speedup={speedup}",
    ]
    assert problems(*fixed) == {}


def test_the_settings_a_replay_does_not_take_are_refused(tmp_path, mooncake):
    assert "workload=trace replays a trace file" in problems()["workload.trace.path"]
    found = problems(
        f"workload.trace.path={mooncake}",
        "workload.trace.length_scale=0.01",
        "workload.trace.speedup=100",
        "workload.history_tokens=[0,64]",
        "workload.conversations=[2,4]",
    )
    assert {"workload.history_tokens", "workload.conversations"} <= set(found)
    found = problems(f"workload.trace.path={tmp_path / 'missing.jsonl'}")
    assert "is not a file" in found["workload.trace.path"]
    cfg = compose_job(["+experiment=flows", f"workload.trace.path={mooncake}"])
    assert "is read only by workload=trace" in str(validate(cfg)[0])


def test_a_malformed_trace_is_refused_with_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}\n{')
    (line,) = problems(f"workload.trace.path={path}").values()
    assert "cannot be replayed: line 2: is not JSON" in line


def test_an_untimed_trace_cannot_follow_recorded_times_and_a_cut_can_leave_nothing(tmp_path):
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([{"id": "a", "messages": [{"role": "user", "content": "hi"}]}]))
    found = problems(f"workload.trace.path={path}", "workload.trace.timing=recorded")
    assert "has no times" in found["workload.trace.timing"]
    assert problems(f"workload.trace.path={path}") == {}  # auto: the workload's arrivals
    found = problems(f"workload.trace.path={path}", "workload.trace.min_turns=2")
    assert "leaves none of the trace's 1 requests" in found["workload.trace"]


def test_pauses_past_the_pull_window_are_warned_with_the_speedup_to_measure_pulls(mooncake):
    cfg = compose_job(
        [
            "+experiment=flows",
            "workload=trace",
            f"workload.trace.path={mooncake}",
            "workload.trace.length_scale=0.01",
            "workload.trace.speedup=2",
        ]
    )
    (warned,) = [w for w in warnings(cfg) if w.field == "workload.trace.speedup"]
    assert "most turns will find D's lease expired" in warned.message
    assert "a speedup of" in warned.fix
