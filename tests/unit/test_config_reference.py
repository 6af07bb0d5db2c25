"""The configuration reference the docs site builds from the schema: every setting there,
each with its meaning, its default and the range validation accepts."""

from __future__ import annotations

import dataclasses

import pytest

from pdbench.config import schema
from pdbench.validate.reference import field_comments, markdown, settings

pytestmark = pytest.mark.unit


def test_every_setting_of_the_schema_says_what_it_means():
    rows = settings(schema.RunConfig)
    assert len(rows) > 150  # every section, the transfer bench's (another module) included
    silent = [r.key for r in rows if not r.meaning]
    assert not silent, f"write a comment beside each of these fields in the schema: {silent}"


def test_the_page_holds_each_setting_with_its_default_range_and_comment():
    page = markdown()
    assert "| `server.block_size` | `int` | `32` | >= 1 and <= 4,096 |" in page
    assert "| `workload.concurrency` | `list[int]` | `[4]` |" in page
    assert "*point axis.*" in page and "*deployment axis.*" in page
    assert "`flow.flows`" in page and "agg, recompute, pull, decode_first" in page
    assert "| `bench.iterations` | `int` | `10` | >= 1 and <= 1,000,000 |" in page
    assert "| `model.name` | `str` | `required` |" in page
    assert "e+0" not in page and "nan" not in page.lower().split("|")


def test_a_comment_is_found_above_a_field_and_on_its_own_lines():
    source = """
@dataclass
class C:
    # first line
    # second line
    a: int = 1  # and its end
    b: int = bounded(
        2, low=0
    )  # closing line
    c: int = 3
"""
    found = field_comments(source)
    assert found[("C", "a")] == "first line second line and its end"
    assert found[("C", "b")] == "closing line"
    assert ("C", "c") not in found


def test_a_field_added_to_the_schema_reaches_the_page():
    names = {r.key for r in settings(schema.RunConfig)}
    for f in dataclasses.fields(schema.SloConfig):
        assert f"slo.{f.name}" in names
