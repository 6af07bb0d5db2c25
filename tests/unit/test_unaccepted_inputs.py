"""Inputs that used to be silently accepted (issue 41's probes) now end in one line each:
the field, its value and the fix, exit 2 from the command line."""

from __future__ import annotations

import pytest

from pdbench.cli import UsageError, parse_argv, precheck

pytestmark = pytest.mark.unit

CASES = [
    (
        ["+experiment=crossover", "search.max_points=1"],
        "search.max_points=1: is below the first pass alone: 8 lengths x 3 repetitions x 1 "
        "load(s) x 2 flows = 48 Points per Deployment",
    ),
    (
        ["+experiment=crossover", "search.min_history_tokens=9000"],
        "search.min_history_tokens=9000: is at or above the longest history the search measures",
    ),
    (
        ["+experiment=crossover_load", "search.first_pass_lengths=100"],
        "search.max_points=600: is below the first pass alone:",
    ),
    (
        ["+experiment=crossover", "workload.turns=1"],
        "workload.turns=1: gives every conversation one turn: nothing is ever on D for pull",
    ),
    (
        ["+experiment=smoke", "workload.request_timeout_s=0.001"],
        "workload.request_timeout_s=0.001: is out of range: use >= 1",
    ),
    (
        ["+experiment=smoke", "server.startup_timeout_s=1"],
        "server.startup_timeout_s=1.0: is out of range: use >= 10",
    ),
    (
        ["+experiment=smoke", "dir=/proc/pdbench-x"],
        "dir=/proc/pdbench-x: is on /proc, a virtual filesystem",
    ),
    (
        ["+experiment=smoke", "cluster.cpus_per_node=64"],
        "cluster.cpus_per_node=64: is more than this machine's 2 cores",
    ),
]


@pytest.mark.parametrize(
    ("args", "line"), CASES, ids=lambda c: " ".join(c) if isinstance(c, list) else ""
)
def test_an_input_that_cannot_measure_what_it_asks_is_refused_with_its_fix(args, line, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(UsageError) as info:
        precheck(parse_argv(args))
    text = str(info.value)
    assert line in text and "Fix: " in text.split(line, 1)[1].splitlines()[0]


def test_the_presets_as_shipped_still_pass(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    for preset in ("crossover", "crossover_load", "smoke"):
        (job,) = precheck(parse_argv([f"+experiment={preset}"]))
        assert job.cfg.name == preset
