"""The test timeline: what ``PDBENCH_TEST_TIMELINE`` makes each pytest worker write is what
``benchmarks/tier_timeline.py`` reads, per worker and group."""

from __future__ import annotations

import json

import pytest

from benchmarks.tier_timeline import Span, compare, group_spans, read_spans, report
from tests import conftest

pytestmark = pytest.mark.unit


def test_each_test_is_one_line_with_its_worker_group_and_span(tmp_path, monkeypatch):
    path = tmp_path / "timeline.jsonl"
    monkeypatch.setenv("PDBENCH_TEST_TIMELINE", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    conftest.pytest_runtest_logstart("tests/e2e/test_a.py::test_one@slurm", None)
    conftest.pytest_runtest_logfinish("tests/e2e/test_a.py::test_one@slurm", None)
    conftest.pytest_runtest_logfinish("tests/e2e/test_a.py::never_started", None)
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["worker"] == "gw1" and line["group"] == "slurm"
    assert line["test"] == "tests/e2e/test_a.py::test_one" and line["end"] >= line["start"]


def test_a_workers_tests_of_one_group_in_a_row_are_one_span(tmp_path):
    rows = [
        ("gw0", "tests/e2e/test_a.py::t1", "slurm", 0, 10),
        ("gw0", "tests/e2e/test_b.py::t1", "slurm", 10, 30),
        ("gw0", "tests/e2e/test_c.py::t1", "test_c", 30, 35),
        ("gw1", "tests/e2e/test_d.py::t1", None, 0, 20),
        ("gw1", "tests/unit/test_e.py::t1", None, 20, 21),
    ]
    path = tmp_path / "timeline.jsonl"
    path.write_text(
        "".join(
            json.dumps({"worker": w, "test": t, "group": g, "start": s, "end": e}) + "\n"
            for w, t, g, s, e in rows
        )
    )
    spans = read_spans(path, "tests/e2e/")
    assert len(spans) == 4  # the unit test left out
    groups = [(g.worker, g.group, g.start, g.end, g.tests) for g in group_spans(spans)]
    assert groups == [
        ("gw0", "slurm", 0, 30, 2),
        ("gw0", "test_c", 30, 35, 1),
        ("gw1", "test_d", 0, 20, 1),  # no group: its module's name
    ]
    text = report(spans)
    assert text.startswith("tier: 0.6 min, 4 tests")
    assert "gw1: busy 0.3 min, done 0.2 min before the end" in text


def test_two_timelines_compare_the_tests_both_ran(tmp_path):
    before = [
        Span("gw0", "tests/e2e/test_a.py::t1", "a", 0, 60),
        Span("gw0", "tests/e2e/test_b.py::t", "b", 60, 90),
    ]
    now = [
        Span("gw1", "tests/e2e/test_a.py::t1", "a", 0, 120),
        Span("gw0", "tests/e2e/test_c.py::t", "c", 0, 30),
    ]
    text = compare(now, before)
    assert text.splitlines()[0] == "1 tests in both: 1.0 min before, 2.0 min now (worker time)"
    assert "only now: 1 tests, 0.5 min; only before: 1 tests, 0.5 min" in text
    assert "60 s ->    120 s  tests/e2e/test_a.py" in text
