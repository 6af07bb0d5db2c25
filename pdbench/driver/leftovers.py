"""Processes of a run still alive on this machine: found, listed and stopped.

Every server and router pdbench starts carries ``PDBENCH_RUN_DIR`` (the run dir) in its
environment; a process with the dir's value is the run's. While a launch follows the dir
(its lock held) they are its servers; otherwise they were left behind (a task killed
before parent-death signals existed, a machine's odd init) and hold the run's ports:
``status`` lists them, ``python -m pdbench stop dir=D`` ends them, and a launch into the
dir refuses to start until they are gone.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from connector.process_env import RUN_DIR_ENV

STOP_GRACE_S = 10.0  # SIGTERM first (vLLM stops its engine core), SIGKILL after this


@dataclass(frozen=True)
class RunProcess:
    pid: int
    command: str  # the command line, shortened
    ports: tuple[int, ...]  # where it listens

    def describe(self) -> str:
        ports = f" listening on {', '.join(map(str, self.ports))}" if self.ports else ""
        return f"pid {self.pid}{ports}: {self.command}"


def run_processes(run_dir: str | Path) -> list[RunProcess]:
    """This machine's processes started for ``run_dir`` (not this one), by pid."""
    import psutil  # lazy: only where processes are looked for

    want = str(Path(run_dir).expanduser().resolve())
    out = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if proc.info["pid"] == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_DIR_ENV) != want:
                continue
            ports = tuple(
                sorted({c.laddr.port for c in proc.net_connections("tcp") if c.status == "LISTEN"})
            )
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        command = " ".join(proc.info.get("cmdline") or [])
        command = command if len(command) <= 100 else command[:97] + "..."
        out.append(RunProcess(proc.info["pid"], command, ports))
    return sorted(out, key=lambda p: p.pid)


def stop_processes(found: list[RunProcess], grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM each process's group, SIGKILL what is left after ``grace_s``; the pids
    still alive after that (none, unless this user may not signal them)."""
    import psutil  # lazy: only where processes are stopped

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def signal_all(sig: signal.Signals) -> None:
        for p in found:
            try:  # its group (an engine core goes with it), unless it is this one's
                group = os.getpgid(p.pid)
                if group == os.getpgid(0):
                    raise PermissionError("this process's own group")
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    os.kill(p.pid, sig)
                except (ProcessLookupError, PermissionError):
                    continue

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p.pid) for p in found):
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
    time.sleep(0.2)
    return [p.pid for p in found if alive(p.pid)]
