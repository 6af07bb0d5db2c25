"""Every value given on the command line is measured or refused: a single value beside the
list that replaces it, a setting the command never reads (issue 27's inputs)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml

from pdbench.cli import UsageError, compose_job, parse_argv, precheck
from pdbench.config.given import LISTS_OF_THEIR_OWN, SCALAR_AXES, given_problems, value_at
from pdbench.config.overrides import schema
from pdbench.config.schema import Command
from pdbench.config.tree import CONF_DIR

pytestmark = pytest.mark.unit

FIELDS = schema().fields
LISTS = sorted(path for path, hint in FIELDS.items() if typing.get_origin(hint) is list)
PRESET = {Command.run: "+experiment=smoke", Command.transfer_bench: "+experiment=transfer_bench"}


def _stem(path: str) -> str:
    """A setting's name without its unit (``ttls_s`` -> ``ttls``)."""
    leaf = path.rsplit(".", 1)[-1]
    return leaf.removesuffix("_s")


def _related(scalar: str, values: str) -> bool:
    """Names that say "one of these" and "these": the same leaf in another section, or, in
    one section, the single value's name but for its last letter starting the list's
    (ttl/ttls, concurrency/concurrencies, conversations/conversation_counts)."""
    if scalar.rsplit(".", 1)[-1] == values.rsplit(".", 1)[-1]:
        return True
    if scalar.rsplit(".", 1)[0] != values.rsplit(".", 1)[0]:
        return False
    one, many = _stem(scalar), _stem(values)
    shared = len(next((p for p in _prefixes(one) if many.startswith(p)), ""))
    return shared >= max(4, len(one) - 1)


def _prefixes(word: str) -> list[str]:
    return [word[:n] for n in range(len(word), 0, -1)]


def test_every_list_setting_replaces_a_single_value_or_is_a_list_of_its_own():
    pairs = {axis.values for axis in SCALAR_AXES}
    unclassified = [path for path in LISTS if path not in pairs and path not in LISTS_OF_THEIR_OWN]
    assert unclassified == [], (
        "a new list setting: add it to pdbench.config.given.SCALAR_AXES if it replaces a "
        "single value, else to LISTS_OF_THEIR_OWN"
    )
    assert set(LISTS_OF_THEIR_OWN) <= set(LISTS) and not set(LISTS_OF_THEIR_OWN) & pairs


def test_every_pair_the_names_suggest_is_declared_and_every_declared_one_exists():
    scalars = [p for p, h in FIELDS.items() if typing.get_origin(h) not in (list, dict)]
    scalars = [p for p in scalars if not hasattr(FIELDS[p], "__dataclass_fields__")]
    suggested = {(s, v) for v in LISTS for s in scalars if _related(s, v)}
    declared = {(axis.scalar, axis.values) for axis in SCALAR_AXES}
    assert suggested == declared
    for scalar, values in declared:
        assert typing.get_origin(FIELDS[values]) is list and scalar in scalars


def yaml_files() -> list[Path]:
    return sorted(CONF_DIR.rglob("*.yaml"))


def _lookup(tree: dict, dotted: str, group: str) -> object:
    """``dotted``'s value in a YAML file of ``group`` (a group file holds its section)."""
    parts = dotted.split(".")
    if group != "experiment" and group:
        if parts[0] != group:
            return None
        parts = parts[1:]
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_no_preset_sets_a_single_value_beside_the_list_that_replaces_it(path):
    tree = yaml.safe_load(path.read_text()) or {}
    group = path.parent.name if path.parent != CONF_DIR else ""
    for axis in SCALAR_AXES:
        if _lookup(tree, axis.values, group) and _lookup(tree, axis.scalar, group) is not None:
            pytest.fail(f"{path}: sets {axis.scalar} and {axis.values}: one of them is dropped")


@pytest.mark.parametrize("axis", SCALAR_AXES, ids=lambda a: a.scalar)
def test_a_single_value_given_beside_its_list_is_refused_and_the_fix_measures_it(axis):
    cfg = compose_job([PRESET[axis.command]])
    value = value_at(cfg, axis.scalar)
    value = getattr(value, "value", value) or "tcp"
    listed = f"{axis.values}=[{value}]"
    job = [PRESET[axis.command], listed, f"{axis.scalar}={value}"]
    (problem,) = given_problems(job, compose_job(job))
    assert str(problem).startswith(f"{axis.scalar}={value}: is given beside {axis.values}=")
    fixed = [PRESET[axis.command], listed]  # the fix: the list alone
    assert given_problems(fixed, compose_job(fixed)) == []
    emptied = [PRESET[axis.command], f"{axis.values}=[]", f"{axis.scalar}={value}"]
    assert given_problems(emptied, compose_job(emptied)) == []


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["+experiment=decode_cost", "flow.decoder_kv_blocks_ttl_s=3"],
            "flow.decoder_kv_blocks_ttl_s=3: is replaced by flow.decoder_kv_blocks_ttls_s=[8,20], "
            "which the preset sets: each of the list's values is measured, this one would not "
            "be. Fix: 'flow.decoder_kv_blocks_ttls_s=[3]' to measure this value alone, or "
            "'flow.decoder_kv_blocks_ttls_s=[8,20,3]' to add it",
        ),
        (
            ["+experiment=decode_cost", "workload.concurrency=2"],
            "workload.concurrency=2: is replaced by workload.concurrencies=[1,4]",
        ),
        (
            ["+experiment=threshold_sweep", "flow.kv_recompute_threshold=100"],
            "flow.kv_recompute_threshold=100: is replaced by "
            "flow.kv_recompute_thresholds=[0,128,1024]",
        ),
        (
            ["+experiment=cache_pressure", "workload.conversations=4"],
            "workload.conversations=4: is replaced by workload.conversation_counts=[2,4,8,12]",
        ),
    ],
)
def test_a_single_value_under_a_preset_s_list_is_refused_on_the_command_line(args, line):
    with pytest.raises(UsageError) as info:
        precheck(parse_argv(args))
    assert line in str(info.value)


def test_a_list_given_replaces_the_preset_s_single_value():
    job = ["+experiment=smoke", "flow.kv_recompute_thresholds=[0,64]"]
    assert given_problems(job, compose_job(job)) == []


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["+experiment=smoke", "bench.iterations=3"], "bench.iterations=3: is not read by the run"),
        (["+experiment=transfer_bench", "workload.turns=3"], "workload.turns=3: is not read"),
        (["+experiment=transfer_bench", "workload=agentic"], "workload=agentic: is not read"),
    ],
)
def test_a_setting_the_command_never_reads_is_refused(args, start):
    (problem,) = given_problems(args, compose_job(args))
    assert str(problem).startswith(start) and ". Fix: drop it, or give it to " in str(problem)
