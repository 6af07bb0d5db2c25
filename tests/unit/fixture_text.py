"""Read a test fixture, without its ``##`` comment lines (see fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture(name: str) -> str:
    lines = (FIXTURES / name).read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.startswith("##"))
