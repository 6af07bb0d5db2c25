"""Every result file the READMEs and the docs cite is in the repository (a file a page points
to as evidence must be there to read; .gitignore ignores only the top-level results/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
READMES = [
    REPO / "README.md",
    REPO / "benchmarks" / "README.md",
    *sorted((REPO / "docs").rglob("*.md")),
]
# benchmarks/results/<file>, or a dated result name (name-YYYY-MM-DD[-more].json) alone
CITED = re.compile(r"(?:benchmarks/results/)?\b([\w-]+-\d{4}-\d{2}-\d{2}(?:-[\w-]+)?\.json)\b")
PATH = re.compile(r"benchmarks/results/([\w.-]+\.json)\b")


def cited_files() -> list[str]:
    names = set()
    for readme in READMES:
        text = readme.read_text()
        names |= {m.group(1) for m in CITED.finditer(text)}
        names |= {m.group(1) for m in PATH.finditer(text)}
    return sorted(n.rstrip(".,:;") for n in names)


def test_the_readmes_cite_result_files():
    assert "timing_fidelity-2026-11-23.json" in cited_files()  # the pattern finds citations


@pytest.mark.parametrize("name", cited_files())
def test_each_cited_result_file_is_committed(name):
    path = RESULTS / name
    assert path.is_file(), f"the README cites benchmarks/results/{name}, which is not there"
    tracked = subprocess.run(
        ["git", "ls-files", "--error-unmatch", str(path.relative_to(REPO))],
        cwd=REPO,
        capture_output=True,
    )
    assert tracked.returncode == 0, f"benchmarks/results/{name} exists but is not committed"


def ignored(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0


def test_only_the_top_level_results_dir_is_ignored():
    assert ignored("results/smoke-20260101-000000/manifest.json")
    assert not ignored("benchmarks/results/crossover_effect-2000-01-01.json")
