"""Every test belongs to the tier its folder names: `make test` selects tiers by marker
(``-m unit``, ``-m "e2e or gpu"``), so a test without its folder's marker would be collected
by neither run and never fail."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
TIERS = ("unit", "e2e", "gpu")


def mark_names(node: ast.AST) -> set[str]:
    """The ``pytest.mark.<name>`` names used in ``node`` (a mark, a list of them, a call)."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Attribute)
        and sub.value.attr == "mark"
    }


def unmarked_tests(source: str, tier: str) -> list[str]:
    """The module's test functions that carry ``tier`` neither through the module's
    ``pytestmark`` nor through a decorator of their own."""
    tree = ast.parse(source)
    module: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            module |= mark_names(node.value)
    if tier in module:
        return []
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test")
        and not any(tier in mark_names(d) for d in node.decorator_list)
    ]


@pytest.mark.parametrize("tier", TIERS)
def test_every_test_carries_its_folders_tier_mark(tier):
    files = sorted((TESTS / tier).glob("test_*.py"))
    assert files, tier
    unmarked = {f.name: u for f in files if (u := unmarked_tests(f.read_text(), tier))}
    assert unmarked == {}, f"tests/{tier}: mark these pytest.mark.{tier}: {unmarked}"


def test_a_test_is_marked_by_its_module_or_its_own_decorator():
    module = "import pytest\npytestmark = [pytest.mark.e2e, pytest.mark.slurm]\ndef test_a(): ...\n"
    own = "import pytest\n@pytest.mark.e2e\n@pytest.mark.slurm\ndef test_a(): ...\n"
    none = "import pytest\n@pytest.mark.slurm\ndef test_a(): ...\ndef helper(): ...\n"
    assert unmarked_tests(module, "e2e") == [] == unmarked_tests(own, "e2e")
    assert unmarked_tests(none, "e2e") == ["test_a"]
    assert unmarked_tests(module, "unit") == ["test_a"]
