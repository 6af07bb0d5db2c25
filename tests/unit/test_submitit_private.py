"""submitit's and Hydra's private names live in one module each
(``pdbench/spec/submitit_private.py``, ``pdbench/config/hydra_private.py``): an upgrade that
moves one fails here, by name, and no other module of the project names one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import submitit

from pdbench.config import hydra_private
from pdbench.spec import submitit_private

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PROJECT = ("pdbench", "jobs", "connector", "analysis", "records", "benchmarks")
PRIVATE = re.compile(
    r"submitit(?:\.\w+)*\._\w+|from submitit(?:\.\w+)* import _\w+|hydra\._internal|"
    r"from hydra(?:\.\w+)* import _\w+"
)
HOMES = {"pdbench/spec/submitit_private.py", "pdbench/config/hydra_private.py"}


def test_submitit_is_the_pinned_version_and_has_every_private_name_pdbench_uses():
    pyproject = (REPO / "pyproject.toml").read_text()
    pinned = re.search(r'"submitit==([^"]+)"', pyproject)
    assert pinned, "pyproject.toml must pin submitit exactly"
    assert submitit.__version__ == pinned.group(1)
    assert submitit_private.missing() == []
    assert callable(submitit_private.make_sbatch_string)
    assert list(submitit_private.parse_node_list("node[1-2]")) == ["node1", "node2"]


def test_hydras_parser_reads_a_command_line_as_hydra_main_does():
    args, unknown = hydra_private.args_parser().parse_known_intermixed_args(
        ["-m", "--cfg", "job", "a=1", "--nope"]
    )
    assert args.multirun and args.cfg == "job" and args.overrides == ["a=1"]
    assert unknown == ["--nope"]


def private_uses(repo: Path = REPO) -> list[str]:
    """``path:line`` of every private submitit or Hydra name outside their homes."""
    out = []
    for root in PROJECT:
        for path in sorted((repo / root).rglob("*.py")):
            rel = str(path.relative_to(repo))
            if rel in HOMES:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if PRIVATE.search(line):
                    out.append(f"{rel}:{number}: {line.strip()}")
    return out


def test_no_other_module_names_a_private_submitit_or_hydra_name():
    assert private_uses() == []


def test_the_check_finds_a_planted_private_name(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.py").write_text("from submitit.slurm.slurm import _parse_node_list\n")
    assert private_uses(tmp_path) == [
        "jobs/x.py:1: from submitit.slurm.slurm import _parse_node_list"
    ]
