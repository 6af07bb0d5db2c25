"""Where one pdbench run's CPU goes: seconds per process, by the part of the run it is.

Runs ``python -m pdbench ARGS`` (with ``dir=`` a fresh folder unless ARGS name one) and
samples every process started for it (its own, and any whose command line or
``PDBENCH_RUN_DIR`` names the run's dir) every ``--every`` seconds; a process's CPU is its
last sample's user + system time, so the tail of a short-lived process's life may be
missed. The total is exact: the run's whole process tree as ``getrusage(RUSAGE_CHILDREN)``
counts it once every process was waited for. On 2 cores, CPU seconds are what the e2e tier
pays: every worker's runs share those cores.

    python -m benchmarks.run_cpu -- +experiment=smoke launch.preflight=false
    python -m benchmarks.run_cpu --repeat 3 -- +experiment=smoke launch.preflight=false \\
        server.prefill_kv_blocks=0 server.decode_kv_blocks=0

Prints a table per run and the runs' totals; saves ``benchmarks/results/run_cpu-<date>.json``
(or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

# Processes that fork children carrying their own command line: what each is, by its depth
# below the first of them (a server forked from the forker, an engine core forked from its
# API server; ``server.cpu_start=exec`` starts each server on its own). First match wins.
CHAINS = (
    (
        "jobs.serving.forkserver",
        ("server forker (imports vLLM once)", "vLLM API server", "vLLM engine core"),
    ),
    ("vllm.entrypoints.openai.api_server", ("vLLM API server", "vLLM engine core")),
)
# A command line's part -> what the process is (first match).
KINDS = (
    ("-m pdbench", "driver"),
    ("submitit", "job (controller and task)"),
    ("jobs.serving.router", "router"),
    ("connector.ucx_probe", "provenance UCX probe"),
    ("jobs.preflight", "preflight"),
)


@dataclass
class Sample:
    """One process of the run: its parent, command line and CPU (user + system) so far."""

    pid: int
    parent: int
    cmdline: str
    cpu_s: float = 0.0


@dataclass
class RunCpu:
    args: list[str]
    returncode: int
    wall_s: float
    total_cpu_s: float  # getrusage(RUSAGE_CHILDREN): every process the run waited for
    sampled_cpu_s: float
    by_kind: dict[str, float] = field(default_factory=dict)
    processes: dict[str, int] = field(default_factory=dict)


def kind_of(sample: Sample, samples: dict[int, Sample]) -> str:
    """What a process is, by its command line; a forked one by its depth in its chain."""
    for marker, names in CHAINS:
        if marker in sample.cmdline:
            depth, parent = 0, samples.get(sample.parent)
            while parent is not None and marker in parent.cmdline:
                depth, parent = depth + 1, samples.get(parent.parent)
            return names[min(depth, len(names) - 1)]
    for part, kind in KINDS:
        if part in sample.cmdline:
            return kind
    return "other"


def by_kind(samples: dict[int, Sample]) -> tuple[dict[str, float], dict[str, int]]:
    """CPU seconds and process count per kind, the most CPU first."""
    cpu: dict[str, float] = {}
    count: dict[str, int] = {}
    for sample in samples.values():
        kind = kind_of(sample, samples)
        cpu[kind] = cpu.get(kind, 0.0) + sample.cpu_s
        count[kind] = count.get(kind, 0) + 1
    order = sorted(cpu, key=lambda k: -cpu[k])
    return {k: round(cpu[k], 2) for k in order}, {k: count[k] for k in order}


def _belongs(proc: psutil.Process, root: int, run_dir: str, since: float) -> bool:
    if proc.create_time() < since - 1:
        return False
    if any(p.pid == root for p in proc.parents()):
        return True
    if run_dir in " ".join(proc.cmdline()):
        return True
    return proc.environ().get("PDBENCH_RUN_DIR", "").startswith(run_dir)


def measure(args: list[str], every_s: float) -> RunCpu:
    """One run of ``python -m pdbench ARGS``, its processes sampled until it ends."""
    run_dir = next((a.split("=", 1)[1] for a in args if a.startswith("dir=")), "")
    if not run_dir:
        run_dir = tempfile.mkdtemp(prefix="run_cpu-")
        args = [*args, f"dir={run_dir}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdbench", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    samples: dict[int, Sample] = {}
    skipped: set[int] = set()
    while proc.poll() is None:
        for p in psutil.process_iter():
            try:
                if p.pid in skipped:
                    continue
                if p.pid not in samples:
                    if p.pid != proc.pid and not _belongs(p, proc.pid, run_dir, started):
                        skipped.add(p.pid)
                        continue
                    samples[p.pid] = Sample(p.pid, p.ppid(), " ".join(p.cmdline()))
                t = p.cpu_times()
                samples[p.pid].cpu_s = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        time.sleep(every_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cpu, count = by_kind(samples)
    return RunCpu(
        args=args,
        returncode=proc.returncode,
        wall_s=round(time.time() - started, 2),
        total_cpu_s=round(total, 2),
        sampled_cpu_s=round(sum(s.cpu_s for s in samples.values()), 2),
        by_kind=cpu,
        processes=count,
    )


def table(run: RunCpu) -> str:
    lines = [
        f"rc {run.returncode}, wall {run.wall_s:.1f} s, CPU {run.total_cpu_s:.1f} s "
        f"(sampled {run.sampled_cpu_s:.1f} s)"
    ]
    for kind, seconds in run.by_kind.items():
        lines.append(f"  {seconds:7.2f} s  {run.processes[kind]:2d} x  {kind}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of the same command")
    parser.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    parser.add_argument("--out", type=Path, help="where the JSON goes")
    parser.add_argument("args", nargs="+", help="pdbench's arguments (after --)")
    opts = parser.parse_args(argv)
    if opts.repeat < 1 or opts.every <= 0:
        parser.error("--repeat must be at least 1 and --every above 0")
    load, runs = os.getloadavg(), []
    for i in range(opts.repeat):
        run = measure(opts.args, opts.every)
        print(f"run {i + 1}/{opts.repeat}: {table(run)}", flush=True)
        runs.append(run)
    totals = [r.total_cpu_s for r in runs]
    print(f"CPU s per run: {totals} (min {min(totals)}, max {max(totals)})")
    out = opts.out or Path("benchmarks/results") / f"run_cpu-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    saved = {
        "machine": os.uname().nodename,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cores": os.cpu_count(),
        "load_avg_start": load,
        "load_avg_end": os.getloadavg(),
        "runs": [asdict(r) for r in runs],
    }
    out.write_text(json.dumps(saved, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
