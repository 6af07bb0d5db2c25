"""The shell commands the README and the docs site show, collected for test_doc_commands.py.

A command is every line of a ``bash`` code block (``\\``-continued lines joined, comments
dropped) and every inline code span that starts with ``python -m`` or ``make``. What each
is checked by depends on its program (``kind``): the test runs each in a form cheap enough
for the unit tier, and fails for a program it does not know.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
INLINE = re.compile(r"`((?:python -m |make |\.venv[\w-]*/bin/python -m )[^`]+)`")
# ``a && b`` is two commands, run in order in one directory by the test.
# A line of a bash block whose program is not run, with why.
NOT_RUN = {
    "aiperf": "printed by `serve` and run as printed by tests/e2e/test_serve.py",
    "guidellm": "printed by `serve` and run as printed by tests/e2e/test_serve.py",
    "git": "a fresh clone is CI itself",
}


@dataclass(frozen=True)
class DocCommand:
    where: str  # page:line
    text: str

    @property
    def argv(self) -> list[str]:
        words = shlex.split(self.text, comments=True)
        while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # VENV=.venv-gpu make ...
            words = words[1:]
        return words

    @property
    def kind(self) -> str:
        """``pdbench``, ``analysis``, ``python:<module>``, ``make`` or the program's name."""
        argv = self.argv
        if argv[0].endswith("python") and len(argv) > 2 and argv[1] == "-m":
            module = argv[2]
            if module in ("pdbench", "analysis"):
                return module
            return f"python:{module}"
        return argv[0]


def block_commands(page: Path) -> list[DocCommand]:
    out: list[DocCommand] = []
    lines = page.read_text().splitlines()
    language = None
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i].strip())
        if fence:
            language = None if language is not None else fence.group(1) or ""
            i += 1
            continue
        if language in ("bash", "sh", "shell"):
            start = i
            text = lines[i].strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1].rstrip() + " " + lines[i].strip()
            for part in text.split(" && "):
                if shlex.split(part, comments=True):
                    out.append(DocCommand(f"{page.relative_to(REPO)}:{start + 1}", part.strip()))
        i += 1
    return out


def inline_commands(page: Path) -> list[DocCommand]:
    """Inline code spans that are commands; a span may wrap across one line break."""
    text = page.read_text()
    out = []
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    for m in INLINE.finditer(prose):
        line = prose.count("\n", 0, m.start()) + 1
        span = " ".join(m.group(1).split())
        for part in span.split(" && "):
            out.append(DocCommand(f"{page.relative_to(REPO)}:{line}", part.strip()))
    return out


def documented_commands() -> list[DocCommand]:
    out = []
    for page in PAGES:
        out += block_commands(page) + inline_commands(page)
    return out
