"""Every input issue 41 found silently accepted, a traceback or a wrong answer, tried again:
each command's exit status and the first line it prints, as a Markdown table.

    .venv/bin/python -m benchmarks.unaccepted_inputs [--out PATH]

Each pdbench input is checked with ``python -m pdbench check ...`` (validation, premises,
SLURM's partitions where ``sinfo`` answers; nothing starts), the analysis inputs against a
synthetic run dir written here (``testbed.synthetic``). Inputs that need a running job or a
full disk have end-to-end tests instead (named in the last column). Saves the table to
``benchmarks/results/unaccepted_inputs-<date>.md`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PDBENCH = [sys.executable, "-m", "pdbench"]
ANALYSIS = [sys.executable, "-m", "analysis"]
WHATIF = [sys.executable, "-m", "analysis.whatif"]

CHECKS = [  # (what the issue said, pdbench arguments after "check")
    ("search.budget_min=nan", ["+experiment=crossover", "search.budget_min=nan"]),
    ("search.max_points=1", ["+experiment=crossover", "search.max_points=1"]),
    ("search.max_points=0", ["+experiment=crossover", "search.max_points=0"]),
    ("search.max_points=-1", ["+experiment=crossover", "search.max_points=-1"]),
    ("search.min_history_tokens=9000", ["+experiment=crossover", "search.min_history_tokens=9000"]),
    (
        "search min > max",
        [
            "+experiment=crossover",
            "search.min_history_tokens=2000",
            "search.max_history_tokens=1000",
        ],
    ),
    (
        "crossover_load search.first_pass_lengths=100",
        ["+experiment=crossover_load", "search.first_pass_lengths=100"],
    ),
    ("search.target_relative_width=2", ["+experiment=crossover", "search.target_relative_width=2"]),
    (
        "workload.request_rate=nan",
        ["+experiment=smoke", "workload.arrival=poisson", "workload.request_rate=nan"],
    ),
    (
        "workload.request_rate=0.001",
        ["+experiment=smoke", "workload.arrival=poisson", "workload.request_rate=0.001"],
    ),
    ("workload.request_timeout_s=0.001", ["+experiment=smoke", "workload.request_timeout_s=0.001"]),
    ("server.startup_timeout_s=1", ["+experiment=smoke", "server.startup_timeout_s=1"]),
    ("'workload.concurrency=[1,1]'", ["+experiment=smoke", "workload.concurrency=[1,1]"]),
    (
        "'flow.kv_recompute_threshold=[0,0]'",
        ["+experiment=smoke", "flow.kv_recompute_threshold=[0,0]"],
    ),
    ("workload.turns=1 with crossover", ["+experiment=crossover", "workload.turns=1"]),
    ("name=../../escape", ["+experiment=smoke", "name=../../escape"]),
    ("+server.env.VLLM_PORT=1", ["+experiment=smoke", "+server.env.VLLM_PORT=1"]),
    ("cluster.cpus_per_node=64 (local)", ["+experiment=smoke", "cluster.cpus_per_node=64"]),
    ("dir=/proc/x", ["+experiment=smoke", "dir=/proc/x"]),
    (
        "cluster.partition=nonexistent_partition",
        ["+experiment=smoke", "cluster=slurm", "cluster.partition=nonexistent_partition"],
    ),
]
E2E = [  # (input, the test that drives it for real)
    ("kill -9 of the driver's process group", "tests/e2e/test_faults.py"),
    ("kill -9 of D's API server", "tests/e2e/test_faults.py"),
    ("a full disk mid-run", "tests/e2e/test_faults.py (a tmpfs of the run's own)"),
    ("a rerun into a dir whose SLURM job still runs", "tests/e2e/test_local_slurm.py"),
    ("serve +experiment=smoke flow=decode_first", "tests/unit/test_serve_mode.py"),
]


def first_line(proc: subprocess.CompletedProcess, needle: str = "") -> str:
    """The first line of the answer (``needle``: the first line holding it, where the answer
    to the input is not the output's first line, as whatif's report)."""
    text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
    lines = [x for x in text if x.strip() and not x.startswith("Triton")]
    if needle:
        lines = [x.strip() for x in lines if needle in x] or lines
    if not lines:
        return ""
    head = lines[0]
    if head.endswith("problem(s) in the config:") and len(lines) > 1:
        head = lines[1]  # the problem itself
    return head.replace("|", "\\|")[:240]


def run(cmd: list[str], needle: str = "") -> tuple[int, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return proc.returncode, first_line(proc, needle)


def analysis_inputs(tmp: Path) -> list[tuple[str, list[str]]]:
    """A synthetic run dir, its policy, and a copy with a record of a newer schema."""
    from testbed.synthetic import write_synthetic_run

    run_dir = tmp / "run"
    write_synthetic_run(run_dir)
    subprocess.run([*ANALYSIS, str(run_dir), "-q"], capture_output=True, timeout=600)
    newer = tmp / "newer"
    shutil.copytree(run_dir, newer)
    point = next((newer / "points").glob("*.json"))
    record = json.loads(point.read_text())
    point.write_text(json.dumps({**record, "schema_version": 99}))
    policy = run_dir / "analysis" / "policy.json"
    return [
        ("analysis D --out D/points", [*ANALYSIS, str(run_dir), "--out", str(run_dir / "points")]),
        ("analysis D D", [*ANALYSIS, str(run_dir), str(run_dir), "-q", "--out", str(tmp / "a2")]),
        ("records of schema_version 99", [*ANALYSIS, str(newer), "-q", "--out", str(tmp / "a3")]),
        (
            "analysis --wandb --wandb-mode online, no key",
            [
                *ANALYSIS,
                str(run_dir),
                "--wandb",
                "--wandb-mode",
                "online",
                "--out",
                str(tmp / "a4"),
            ],
        ),
        (
            "whatif policy=... concurrency=100000",
            [*WHATIF, f"policy={policy}", "bandwidth_gbps=400", "concurrency=100000"],
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    rows = ["| input | exit | first line |", "|---|---|---|"]
    for what, overrides in CHECKS:
        code, line = run([*PDBENCH, "check", *overrides])
        rows.append(f"| `{what}` | {code} | {line} |")
        print(rows[-1], flush=True)
    code, line = run([*PDBENCH, "check", "+experiment=smoke", "--cfg", "job"])
    rows.append(f"| `check --cfg job` | {code} | {line} |")
    with tempfile.TemporaryDirectory() as tmp:
        for what, cmd in analysis_inputs(Path(tmp)):
            code, line = run(cmd, "concurrency 100000" if "whatif" in what else "")
            rows.append(f"| `{what}` | {code} | {line} |")
            print(rows[-1], flush=True)
    for what, test in E2E:
        rows.append(f"| `{what}` | (e2e) | {test} |")
    day = datetime.date.today().isoformat()
    out = Path(args.out or f"benchmarks/results/unaccepted_inputs-{day}.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(rows) + "\n")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
