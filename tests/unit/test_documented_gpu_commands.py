"""Every GPU-cluster command the README, the docs and the conf/ comments show validates, and
places P and D where the transport it names carries the KV: rdma between nodes, nvlink inside one.
A GPU user's first allocation starts from these lines."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pdbench.cli import UsageError, parse_argv, precheck
from pdbench.validate.kv_path import kv_node_pairs

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GPU_CLUSTER = "cluster=h100_8gpu"


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) of every ``python -m pdbench`` line naming a GPU cluster in the
    README and docs/ (code blocks and table cells) and in conf/*/*.yaml comments
    (``\\``-continued)."""
    found = []
    sources = [
        REPO / "README.md",
        *sorted((REPO / "docs").rglob("*.md")),
        *sorted((REPO / "conf").rglob("*.yaml")),
    ]
    for path in sources:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            line = lines[i].lstrip("# ").rstrip()
            start = line.find("python -m pdbench ")
            where = f"{path.relative_to(REPO)}:{i + 1}"
            i += 1
            if start < 0:
                continue
            text = line[start:]
            while text.endswith("\\") and i < len(lines):
                text = text[:-1] + " " + lines[i].lstrip("# ").strip()
                i += 1
            text = text.split("`")[0].split("  #")[0].split("  (")[0].strip()
            if GPU_CLUSTER in text:
                found.append((where, text))
    return found


COMMANDS = documented_commands()


def jobs_of(command: str):
    argv = shlex.split(command)[3:]  # after "python -m pdbench"
    return precheck(parse_argv(argv))


def test_the_docs_show_gpu_commands():
    wheres = {w.split(":")[0] for w, _ in COMMANDS}
    assert {"README.md", "docs/gpu.md", "conf/experiment/crossover.yaml"} <= wheres, COMMANDS
    assert any("transport=rdma" in c for _, c in COMMANDS)
    assert any("transport=nvlink" in c for _, c in COMMANDS)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_gpu_command_validates_and_measures_its_fabric(where, command):
    jobs = jobs_of(command)
    for job in jobs:
        cfg = job.cfg
        if cfg.command.value == "transfer_bench":
            continue  # two tasks on the cluster's two nodes: no P/D placement
        pairs = kv_node_pairs(cfg)
        if cfg.transport.name == "rdma":
            assert all(p != d for p, d in pairs), (where, pairs)
        if cfg.transport.name == "nvlink":
            assert all(p == d for p, d in pairs), (where, pairs)


@pytest.mark.parametrize(
    ("command", "fix"),
    [
        (
            "python -m pdbench +experiment=crossover model=llama3_8b cluster=h100_8gpu "
            "transport=rdma model.path=/shared/models/Llama-3.1-8B-Instruct",
            "Fix: topology=1p1d_cross to measure rdma between nodes",
        ),
        (
            "python -m pdbench +experiment=crossover model=llama3_8b cluster=h100_8gpu "
            "transport=nvlink topology=1p1d_cross model.path=/shared/models/Llama-3.1-8B-Instruct",
            "Fix: transport=rdma (or tcp) for KV across nodes",
        ),
    ],
)
def test_a_transport_its_placement_cannot_measure_is_refused_with_the_fix(command, fix):
    with pytest.raises(UsageError) as err:
        jobs_of(command)
    assert fix in str(err.value)
    assert re.search(r"transport=(rdma|nvlink): ", str(err.value))
