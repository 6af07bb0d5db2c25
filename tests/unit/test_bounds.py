"""Every numeric setting is bounded where it is declared: each numeric field of the schema
(and of the transfer bench's settings) has bounds, and nan, inf, -1, 0 and a huge value are
refused or taken exactly as those bounds say, with the field, the value and a fix."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from pdbench.config.bounds import Bounds, bounded
from pdbench.config.compose import compose_job
from pdbench.config.schema import Command
from pdbench.validate.bounds import check_bounds, numeric_fields
from pdbench.validate.rules import validate
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit

TRIES = (float("nan"), float("inf"), -1, 0, 10**15)


def unbounded(obj) -> list[str]:
    return [name for name, _, bounds in numeric_fields(obj) if bounds is None]


def test_every_numeric_setting_declares_its_bounds():
    names = [name for name, _, _ in numeric_fields(cpu_run())]
    assert len(names) > 80  # the walk reaches every section, lists and the bench included
    assert {"workload.request_rate", "bench.iterations", "flow.kv_recompute_threshold"} <= set(
        names
    )
    assert unbounded(cpu_run()) == []


def test_a_numeric_field_added_without_bounds_is_caught():
    @dataclasses.dataclass
    class Grown:
        size: int = bounded(1, low=1)
        forgotten: float = 0.5
        listed: list[int] = dataclasses.field(default_factory=list)

    assert unbounded(Grown()) == ["forgotten", "listed"]


def set_leaf(cfg, name: str, value) -> None:
    *path, leaf = name.split(".")
    obj = cfg
    for part in path:
        obj = getattr(obj, part)
    current = getattr(obj, leaf)
    if isinstance(value, float) and isinstance(current, int) and value.is_integer():
        value = int(value)
    setattr(obj, leaf, [value] if isinstance(current, list) else value)


@pytest.mark.parametrize("name", [n for n, _, _ in numeric_fields(cpu_run())])
def test_each_setting_refuses_what_its_bounds_refuse(name):
    base = cpu_run()
    if name.startswith("bench."):  # read by the transfer bench alone
        base.command = Command.transfer_bench
    bounds: Bounds = dict((n, b) for n, _, b in numeric_fields(base))[name]
    for value in TRIES:
        cfg = copy.deepcopy(base)
        set_leaf(cfg, name, value)
        mine = [p for p in check_bounds(cfg) if p.field == name]
        expected = bounds.problem(value)
        if value != value or value in (float("inf"), -1):  # nan, inf, negative: never
            assert expected is not None, (name, value)
        assert bool(mine) == bool(expected), (name, value, mine)
        if mine:
            (p,) = mine
            assert f"{name}=" in p.fix and "use " in p.message
            # the problem validate() reports for the field: this one, or its own rule's
            assert [q for q in validate(cfg) if q.field == name], (name, value)


def test_a_rule_of_its_own_keeps_its_message_and_bounds_add_no_second_one():
    cfg = cpu_run()
    cfg.workload.conversations = 0
    mine = [p for p in validate(cfg) if p.field == "workload.conversations"]
    assert len(mine) == 1
    cfg = cpu_run()
    cfg.search.target_relative_width = 2.0  # silently taken before
    (p,) = [p for p in validate(cfg) if p.field == "search.target_relative_width"]
    assert str(p).startswith("search.target_relative_width=2.0: ")


@pytest.mark.parametrize(
    ("field", "value", "fix"),
    [
        ("workload.concurrency", [1, 1], "workload.concurrency=[1]"),
        ("flow.kv_recompute_threshold", [0, 64, 0], "flow.kv_recompute_threshold=[0,64]"),
        ("workload.history_tokens", [0, 128, 128], "workload.history_tokens=[0,128]"),
    ],
)
def test_an_axis_value_given_twice_is_refused(field, value, fix):
    """Given twice, a value doubled the plan (servers started twice, Points measured twice)."""
    cfg = cpu_run()
    section, name = field.split(".")
    setattr(getattr(cfg, section), name, value)
    (p,) = [p for p in validate(cfg) if p.field == field]
    assert "more than once" in p.message and p.fix == fix


def test_a_name_leaving_results_or_an_env_the_plan_sets_is_refused():
    from pdbench.cli import compose_job

    def problems(*overrides: str) -> list[str]:
        return [str(p) for p in validate(compose_job(["+experiment=smoke", *overrides]))]

    (line,) = problems("name=../../escape")
    assert line.startswith("name=../../escape: names the run's directory") and "name=escape" in line
    (line,) = problems("+server.env.VLLM_PORT=1")
    assert line.startswith("server.env.VLLM_PORT=1: is set by pdbench for each instance")
    assert problems("+server.env.PDBENCH_ENGINE_START=spawn", "name=my.run_2") == []


def test_a_rule_that_saw_a_replaced_value_names_the_value_as_given():
    """nan is replaced before the rules run (their arithmetic); the problem a rule finds
    names nan, not the 0 it saw, and keeps its own fix (issue 41: 'request_rate=0')."""
    cfg = compose_job(
        ["+experiment=smoke", "workload.arrival=poisson", "workload.request_rate=nan"]
    )
    (problem,) = [p for p in validate(cfg) if p.field == "workload.request_rate"]
    assert str(problem).startswith("workload.request_rate=nan: must be a rate > 0")
    assert "workload.request_rate=2" in problem.fix
