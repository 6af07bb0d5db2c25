"""The configuration reference, generated from the schema's dataclasses and their comments.

Every setting is a field of ``pdbench/config/schema.py``; what a field means is the comment
written beside it there (the lines of ``#`` right above it and the one at the end of its
line). ``markdown()`` walks ``RunConfig`` and renders one table per section: key, type,
default, range (the field's ``Bounds``), whether it is a sweep axis, and that comment. The
docs site builds its reference page from it (``docs/hooks/config_reference.py``), so the page
cannot drift from the code. It sits in ``validate`` because the transfer bench's bounds are
declared there (``EXTERNAL_BOUNDS``).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import tokenize
import typing
from dataclasses import MISSING, Field
from functools import cache
from pathlib import Path
from typing import Any

from pdbench.config import schema
from pdbench.config.axes import AXIS_KEY
from pdbench.config.bounds import bounds_of, number
from pdbench.validate.bounds import EXTERNAL_BOUNDS


def field_comments(source: str) -> dict[tuple[str, str], str]:
    """(class name, field name) -> the comment written with that field in ``source``.

    The comment is the run of ``#`` lines right above the field's line plus any comment on
    the field's own lines (a value split over several lines included); ``noqa`` notes are
    left out.
    """
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            if not text.startswith("noqa"):
                comments[tok.start[0]] = text.split("# noqa")[0].strip()
    lines = source.splitlines()
    out: dict[tuple[str, str], str] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            above: list[str] = []
            line = item.lineno - 1
            while line >= 1 and lines[line - 1].strip().startswith("#"):
                above.insert(0, comments.get(line, ""))
                line -= 1
            own = [comments[n] for n in range(item.lineno, item.end_lineno + 1) if n in comments]
            text = " ".join(t for t in [*above, *own] if t)
            if text:
                out[(node.name, item.target.id)] = text
    return out


@cache
def comments_of(path: str) -> dict[tuple[str, str], str]:
    return field_comments(Path(path).read_text())


def comment(cls: type, name: str) -> str:
    """The comment written with field ``name`` of the dataclass ``cls``, in its own module."""
    return comments_of(inspect.getsourcefile(cls)).get((cls.__name__, name), "")


def type_name(tp: Any) -> str:
    """A field's type as a reader writes it: ``int``, ``list[str]``, ``Flow``, ``Flow or null``
    (no ``|``: it would split a table's cell)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:
        names = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(map(type_name, args))}]"
    return getattr(tp, "__name__", str(tp))


def default_text(f: Field) -> str:
    if f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        return "required"
    if value == "???":  # OmegaConf's MISSING: a group file or the command line gives it
        return "required"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return value_text(value)


def value_text(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {value_text(v)}" for k, v in value.items()) + "}"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return number(value)
    return str(value)


def enum_of(tp: Any) -> type[enum.Enum] | None:
    for t in (tp, *typing.get_args(tp)):
        if inspect.isclass(t) and issubclass(t, enum.Enum):
            return t
    return None


@dataclasses.dataclass(frozen=True)
class Setting:
    """One row of the reference."""

    key: str
    type: str
    default: str
    allowed: str
    axis: str
    meaning: str


def settings(cls: type, prefix: str = "") -> list[Setting]:
    """Every leaf setting under the dataclass ``cls`` by its dotted key."""
    hints = typing.get_type_hints(cls)
    rows: list[Setting] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if inspect.isclass(tp) and dataclasses.is_dataclass(tp):
            rows.extend(settings(tp, prefix=f"{key}."))
            continue
        bounds = bounds_of(f) or EXTERNAL_BOUNDS.get(key)
        choices = enum_of(tp)
        if choices is not None:
            allowed = ", ".join(str(m.value) for m in choices)
        elif bounds is not None:
            allowed = bounds.describe()
        else:
            allowed = ""
        level = f.metadata.get(AXIS_KEY)
        rows.append(
            Setting(
                key=key,
                type=type_name(tp),
                default=default_text(f),
                allowed=allowed,
                axis=f"{level.value} axis" if level is not None else "",
                meaning=comment(cls, f.name),
            )
        )
    return rows


def cell(text: str) -> str:
    """Text safe in a Markdown table cell: no column break, and outside code spans no HTML
    tag (a comment's ``<name>`` shows as written)."""
    parts = text.replace("|", "\\|").replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def markdown() -> str:
    """The reference page: one table per top-level section of ``RunConfig``."""
    hints = typing.get_type_hints(schema.RunConfig)
    top = dataclasses.fields(schema.RunConfig)
    out = [
        "# Configuration reference",
        "",
        "Generated from `pdbench/config/schema.py` when the docs are built: every setting,",
        "its type, default, the range validation accepts, and the comment written beside it",
        "in the schema. Set any of them on the command line (`server.block_size=32`), in a",
        "preset or a config group file. A *point axis* or *deployment axis* takes a value or",
        "a list (`'workload.concurrency=[1,4]'`): every value is measured, a deployment axis",
        "on servers of its own. Defaults are the schema's; `conf/config.yaml` and the",
        "presets set many of them (`python -m pdbench +experiment=NAME --cfg job` prints",
        "the composed values).",
        "",
    ]
    rows = settings(schema.RunConfig)
    out += table("Top level", [r for r in rows if "." not in r.key])
    for f in top:
        cls = hints[f.name]
        if dataclasses.is_dataclass(cls):
            section = [r for r in rows if r.key.startswith(f"{f.name}.")]
            out += table(f"`{f.name}`", section, inspect.getdoc(cls) or "")
    return "\n".join(out) + "\n"


def table(title: str, rows: list[Setting], doc: str = "") -> list[str]:
    out = [f"## {title}", ""]
    if doc:
        out += [doc.replace("``", "`"), ""]
    out += [
        "| key | type | default | allowed | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        meaning = " ".join(t for t in (f"*{r.axis}.*" if r.axis else "", r.meaning) if t)
        out.append(
            f"| `{r.key}` | `{r.type}` | `{r.default}` | {r.allowed} "
            f"| {cell(meaning.replace('``', '`'))} |"
        )
    return [*out, ""]
