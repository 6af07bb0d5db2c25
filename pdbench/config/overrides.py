"""Command-line overrides checked against pdbench's schema before Hydra composes anything.

Hydra rejects an unknown key and suggests adding it with ``+``; with ``+`` the key is
composed, then dropped when the config is typed, and the run starts without it
(``+dry_run=true`` started a real run). Here an override's key must be a schema field, a
config group, a key under a free-form mapping (``cluster.env.X``, ``+`` allowed there) or
Hydra's own (``hydra.*``); anything else is refused with the closest valid keys named.
Group choices and enum values (``command``, ``cluster.executor``, ...) are checked the same
way, every value of a ``-m`` sweep included. Pure: reads only the files under ``conf/``.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import OverrideParseException

from pdbench.config.axes import Level, axes_of
from pdbench.config.schema import RunConfig
from pdbench.config.tree import CONF_DIR, default_choices, groups

HINT = "name the key meant (python -m pdbench --help lists groups and presets; --cfg job every key)"


class OverrideError(ValueError):
    """Every bad override of a command line, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(self.problems)
        super().__init__(f"{len(self.problems)} problem(s) on the command line:\n{lines}")


@dataclass(frozen=True)
class Schema:
    """The keys a command line may name."""

    fields: dict[str, type]  # dotted path -> annotated type ("launch.dry_run" -> bool)
    open_maps: frozenset[str]  # dict-typed fields: any key below them is allowed
    lists: frozenset[str]  # list-typed fields: an index below them is allowed
    groups: dict[str, list[str]]  # config group -> its presets
    default_groups: frozenset[str]  # groups config.yaml picks (set without `+`)
    axes: dict[str, Level]  # sweep axes: a value or a list (pdbench.config.axes)


def _walk(cls: type, prefix: str, out: dict[str, type]) -> None:
    for f, hint in typing.get_type_hints(cls).items():
        if f not in {x.name for x in dataclasses.fields(cls)}:
            continue
        path = f"{prefix}{f}"
        out[path] = hint
        if dataclasses.is_dataclass(hint):
            _walk(hint, f"{path}.", out)


def schema(conf: Path = CONF_DIR) -> Schema:
    fields: dict[str, type] = {}
    _walk(RunConfig, "", fields)
    origin = {path: typing.get_origin(hint) for path, hint in fields.items()}
    return Schema(
        fields=fields,
        open_maps=frozenset(p for p, o in origin.items() if o is dict),
        lists=frozenset(p for p, o in origin.items() if o is list),
        groups=groups(conf),
        default_groups=frozenset(default_choices(conf)),
        axes=axes_of(RunConfig),
    )


def closest(word: str, candidates: list[str], n: int = 3) -> list[str]:
    """The candidates nearest ``word`` (the same last component counts), best ones only."""
    leaf = word.rsplit(".", 1)[-1]
    scores: dict[str, float] = {}
    for cand in dict.fromkeys(candidates):
        cand_leaf = cand.rsplit(".", 1)[-1]
        whole = difflib.SequenceMatcher(None, word, cand).ratio()
        by_leaf = difflib.SequenceMatcher(None, leaf, cand_leaf).ratio() - 0.05
        scores[cand] = max(whole, by_leaf)
    if not scores or max(scores.values()) < 0.6:
        return []
    best = max(scores.values())
    near = sorted((c for c, v in scores.items() if v >= best - 0.1), key=lambda c: -scores[c])
    return near[:n]


def _did_you_mean(names: list[str]) -> str:
    if not names:
        return "nothing is close."
    return f"did you mean {', '.join(names[:-1])}{' or ' if len(names) > 1 else ''}{names[-1]}?"


def _values(override: Override) -> list[str]:
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    if override.is_discrete_sweep():
        return list(override.sweep_string_iterator())
    return []


def _check_group(o: Override, s: Schema) -> list[str]:
    group, line = o.key_or_group, o.input_line
    plus = o.is_add() or o.is_force_add()
    if group in s.default_groups and o.is_add():
        return [
            f"{line}: {group} is a group config.yaml already picks; set it without the "
            f"plus. Fix: {line.lstrip('+')}"
        ]
    if group not in s.default_groups and not plus and not o.is_delete():
        return [f"{line}: the {group} group is added with a plus. Fix: +{line}"]
    if o.is_delete():
        return []
    presets = s.groups.get(group, [])
    out = []
    for value in _values(o):
        if value in presets or value == "null":
            continue
        out.append(
            f"{line}: there is no {group} preset '{value}' (conf/{group}/{value}.yaml); "
            f"{_did_you_mean(closest(value, presets))} Choices: {', '.join(presets)}"
        )
    return out


def _check_enum(o: Override, enum: type[Enum]) -> list[str]:
    names = [m.name for m in enum]
    out = []
    for value in _values(o):
        if value not in names:
            out.append(
                f"{o.input_line}: '{value}' is not one of {', '.join(names)}; "
                f"{_did_you_mean(closest(value, names))}"
            )
    return out


def _under(key: str, parents: frozenset[str]) -> bool:
    return any(key.startswith(f"{p}.") for p in parents)


def _check_key(o: Override, s: Schema) -> list[str]:
    key, line = o.key_or_group, o.input_line
    if key in s.fields:
        if o.is_add() and key in s.open_maps:  # Hydra's + refuses a map that is there
            return [f"{line}: {key} is already a map; ++ adds these keys to it. Fix: +{line}"]
        if o.is_add():
            return [f"{line}: {key} is already a setting; set it without the plus. Fix: {line[1:]}"]
        hint = s.fields[key]
        if isinstance(hint, type) and issubclass(hint, Enum) and not o.is_delete():
            return _check_enum(o, hint)
        return []
    if _under(key, s.open_maps):
        return []
    parent, _, last = key.rpartition(".")
    if parent in s.lists and last.isdigit():
        return []
    values = _values(o)
    by_value = [g for g, presets in s.groups.items() if values and set(values) <= set(presets)]
    names = closest(key, by_value) or closest(key, [*s.fields, *s.groups])
    value = line.split("=", 1)[1] if "=" in line else ""
    fix = f"{names[0]}={value}" if len(names) == 1 and value else HINT
    why = "is not a pdbench setting"
    if o.is_add() or o.is_force_add():
        why += (
            " (a + adds keys only under free-form maps such as cluster.env or "
            "server.env; anywhere else the key would be dropped and the run start without it)"
        )
    return [f"{line}: {key} {why}; {_did_you_mean(names)} Fix: {fix}"]


def image_quoting_fix(overrides: list[str]) -> str:
    """The fix for Hydra's lexer error on an unquoted enroot URI (``#`` starts a comment in
    Hydra's override grammar): "" when no override sets ``cluster.container_image`` to one."""
    for word in overrides:
        key, _, value = word.partition("=")
        if key.lstrip("+") == "cluster.container_image" and "#" in value and value[:1] not in "'\"":
            return (
                "Fix: quote the image for Hydra and for the shell: "
                f"'cluster.container_image=\"{value}\"' (an enroot URI's '#' cannot stand "
                "unquoted in a Hydra override)"
            )
    return ""


def quoting_fix(overrides: list[str]) -> str:
    """The fix for Hydra's lexer error on an override whose value has characters its grammar
    takes only quoted (``>``, ``#``, non-ASCII letters, ...): the value quoted, each element
    of a ``[...]`` list on its own; "" when no single override fails or a quote is in it."""
    parser = OverridesParser.create()
    for word in overrides:
        try:
            parser.parse_overrides([word])
        except OverrideParseException:
            key, _, value = word.partition("=")
            if not value or '"' in value or "'" in value:
                return ""
            if value.startswith("[") and value.endswith("]"):
                items = [v.strip() for v in value[1:-1].split(",") if v.strip()]
                quoted = "[" + ",".join(f'"{v}"' for v in items) + "]"
            else:
                quoted = f'"{value}"'
            return (
                f"Fix: quote the value for Hydra and for the shell: '{key}={quoted}' (Hydra's "
                "override grammar takes such characters only inside quotes)"
            )
    return ""


def check_overrides(overrides: list[str], s: Schema | None = None) -> list[Override]:
    """The parsed overrides; ``OverrideError`` listing every bad one (with suggestions)."""
    s = s or schema()
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as err:
        fix = image_quoting_fix(overrides) or quoting_fix(overrides)  # an enroot URI's '#'
        raise OverrideError([str(err).strip() + (f"\n{fix}" if fix else "")]) from err
    problems = []
    seen: dict[str, str] = {}
    for o in parsed:
        element = o.get_key_element().lstrip("+~")
        if element in seen:
            problems.append(
                f"{seen[element]} and {o.input_line}: one key given twice (Hydra would keep the "
                "last silently). Fix: keep one; sweep values go in one list (-m key=a,b)"
            )
        seen[element] = o.input_line
    for o in parsed:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or o.package is not None:
            continue
        if key in s.groups or key in s.default_groups:
            problems += _check_group(o, s)
        else:
            problems += _check_key(o, s)
    if problems:
        raise OverrideError(problems)
    return parsed


def _one_value(o: Override, value: str, axes: dict[str, Level]) -> str:
    """``key=value``; an axis given one value written as the list of one it is."""
    key = o.get_key_element()
    if o.key_or_group in axes and not value.startswith("["):
        return f"{key}=[{value}]"
    return f"{key}={value}"


def as_lists(overrides: list[str], s: Schema | None = None) -> list[str]:
    """The overrides with each sweep axis given one value (``workload.concurrency=4``) as the
    list of one it is (``workload.concurrency=[4]``), so that Hydra types it; lists, sweeps
    (``-m key=1,4``: ``combinations`` wraps each value) and words that do not parse (the
    override check names them) stay as they are."""
    axes = (s or schema()).axes
    parser = OverridesParser.create()
    out = []
    for word in overrides:
        try:
            (o,) = parser.parse_overrides([word])
        except OverrideParseException:
            out.append(word)
            continue
        plain = not o.is_sweep_override() and not o.is_delete() and o.key_or_group in axes
        out.append(_one_value(o, o.get_value_element_as_str(), axes) if plain else word)
    return out


def combinations(parsed: list[Override], s: Schema | None = None) -> list[list[str]]:
    """Every job of a ``-m`` sweep as its list of overrides (one job without sweeps).

    As Hydra's basic sweeper expands them: the cartesian product of each key's values, a
    later override of the same key replacing an earlier one. An axis's value in a sweep
    (``-m workload.concurrency=1,4``) is a list of one (``[1]``, ``[4]``): the sweep's plan
    (``pdbench.plan.sweep``) measures them on the same servers.
    """
    axes = (s or schema()).axes
    per_key: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        values = _values(o) if o.is_sweep_override() else [o.get_value_element_as_str()]
        if o.is_delete() and not o.is_sweep_override() and o.value() is None:
            per_key[key] = [key]
        else:
            per_key[key] = [_one_value(o, v, axes) for v in values]
    jobs: list[list[str]] = [[]]
    for options in per_key.values():
        jobs = [job + [opt] for job in jobs for opt in options]
    return jobs
