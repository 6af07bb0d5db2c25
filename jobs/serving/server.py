"""Own every process pdbench starts: a server in its own process group, torn down on exit.

``ServerProcess`` starts a command with ``start_new_session=True`` (so the whole group can be
signalled), writes its output to a log file, waits for ``/health`` while checking the
process is alive, and on exit sends SIGTERM to the group, then SIGKILL after a grace period.

Nothing outlives the task that started it, however the task ends: each server is started
with a parent-death signal (``connector.parent_death``: SIGKILL when the task dies, even by
SIGKILL; a vLLM engine core asks for its own, so it follows its API server), and the stop
signals the group by the leader's pid (a session leader's pid is its group's id), so an
engine core whose API server was killed alone, still in the group, dies with the
deployment. SIGKILL, not SIGTERM: with the task gone nothing needs a graceful end, and
vLLM's and aiohttp's graceful shutdowns outlasted 15 s on a loaded host.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from jobs.serving.forker import ForkedProcess, ServerForker
from jobs.serving.forkserver import prepare_server_process
from jobs.serving.server_log import log_tail


class ServerStartError(RuntimeError):
    """A server exited or did not become healthy in time; carries its log tail."""


class ServerProcess:
    """A long-running subprocess with a health URL, used as a context manager."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        env: dict[str, str],
        log_path: Path,
        health_url: str,
        grace_s: float = 15.0,
        cpus: list[int] | None = None,
        forker: ServerForker | None = None,
    ):
        """``cpus``: the cores the whole process tree runs on (a CPU instance's API server,
        engine core and workers: unpinned, vLLM's processes of every instance pile onto one
        core; ``VLLM_CPU_OMP_THREADS_BIND`` pins only the forward threads). None: any.
        ``forker``: where ``cmd`` is ``python -m`` of the forker's module, the process is
        forked from it (``jobs.serving.forker``) instead of started on its own."""
        self.name = name
        self.cpus = sorted(set(cpus)) if cpus else None
        self.cmd = cmd
        self.env = env
        self.log_path = Path(log_path)
        self.health_url = health_url
        self.grace_s = grace_s
        self.forker = forker if forker is not None and forker.can_fork(cmd) else None
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self._log = None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        pinned = f"[cores {','.join(map(str, self.cpus))}] " if self.cpus else ""
        self._log.write(f"$ {pinned}{' '.join(self.cmd)}\n".encode())
        if self.forker is not None:
            self._log.write(
                f"pdbench: forked from pid {self.forker.proc.pid} once it has imported "
                f"{self.forker.module} (log {self.forker.log_path}; server.cpu_start=exec "
                "starts each server on its own)\n".encode()
            )
        self._log.flush()
        cpus, parent = self.cpus, os.getpid()
        if self.forker is not None:
            env = {**os.environ, **self.env}
            self.proc = self.forker.fork(self.cmd[3:], env, self.log_path, cpus or [])
            return self
        self.proc = subprocess.Popen(
            self.cmd,
            env={**os.environ, **self.env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=lambda: prepare_server_process(cpus, parent),
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_until_ready(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Poll health until ready; raise with the log tail if the process dies or time runs out."""
        return wait_all_ready([self], timeout_s, lambda _: None, poll_s=poll_s)[self.name]

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period, reap."""
        proc = self.proc
        if proc is not None and proc.pid is not None:  # not forked yet: ends with its forker
            pgid = proc.pid  # its own session's leader: the group's id, dead or alive
            _signal_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass
            # Children (engine cores) may outlive the leader: end the whole group.
            _signal_group(pgid, signal.SIGKILL)
            try:
                proc.wait(timeout=self.grace_s)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def last_log_line(path: Path, width: int = 120) -> str:
    """The last non-empty line of a log, cut to ``width`` characters ('' when none)."""
    lines = [line for line in log_tail(path, 5).splitlines() if line.strip()]
    line = lines[-1].strip() if lines else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def startup_line(waited_s: float, up: list[str], waiting: dict[str, str]) -> str:
    """One progress line while servers start: seconds waited, who is up, the last log line
    of each server still starting."""
    parts = [f"servers starting, {waited_s:.0f} s: up {', '.join(up) or 'none'}"]
    for name, last in waiting.items():
        parts.append(f"{name} starting" + (f" ({last})" if last else ""))
    return "; ".join(parts)


def wait_all_ready(
    procs: list[ServerProcess],
    timeout_s: float,
    report: Callable[[str], None],
    every_s: float = 10.0,
    poll_s: float = 0.5,
) -> dict[str, float]:
    """Wait until every server answers /health; seconds each took. Raises
    ``ServerStartError`` (with the log tail) as soon as one exits or time runs out, and
    calls ``report`` with a ``startup_line`` every ``every_s`` seconds meanwhile."""
    start = time.monotonic()
    took: dict[str, float] = {}
    next_report = start + every_s
    while True:
        for proc in procs:
            if proc.name in took:
                continue
            if not proc.alive():
                code = proc.proc.returncode if proc.proc else None
                raise ServerStartError(
                    f"{proc.name} exited with code {code} before becoming healthy; "
                    f"log {proc.log_path}:\n{log_tail(proc.log_path)}"
                )
            if proc.healthy():
                took[proc.name] = time.monotonic() - start
        now = time.monotonic()
        waiting = [p for p in procs if p.name not in took]
        if not waiting:
            return took
        if now - start > timeout_s:
            late = waiting[0]
            raise ServerStartError(
                f"{late.name} not healthy after {timeout_s:.0f} s at {late.health_url}; "
                f"log {late.log_path}:\n{log_tail(late.log_path)}"
            )
        if now >= next_report:
            up = [p.name for p in procs if p.name in took]
            report(
                startup_line(now - start, up, {p.name: last_log_line(p.log_path) for p in waiting})
            )
            next_report = now + every_s
        time.sleep(poll_s)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
