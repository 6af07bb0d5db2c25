"""The task's side of ``jobs.serving.forkserver``: servers forked from one process that
imported their module once, each held like a ``subprocess.Popen``.

A CPU server spends ~10 of its ~15 CPU-seconds of start importing vLLM; a task that starts
P and D imports it once instead of twice (``server.cpu_start=fork``, the default; GPU
instances are always started on their own). The forked server runs the same command line
in the same environment as one started on its own; ``ps`` shows the forker's command line
for it (``python -m jobs.serving.forkserver MODULE``), and ``/proc/PID/environ`` the
forker's environment, which holds what every server of the task shares (the run dir
included: ``python -m pdbench status`` and ``stop`` find them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from jobs.serving.forkserver import prepare_server_process
from jobs.serving.server_log import log_tail
from pdbench.spec.server_fork import MODULE_FLAG, forker_command

CLOSE_GRACE_S = 10.0  # the forker's own end once its stdin closes (it SIGKILLs its children)


class ForkedProcess:
    """A server the forker was asked for: ``pid`` once forked, ``returncode`` once ended
    (the part of ``subprocess.Popen`` that ``ServerProcess`` uses)."""

    def __init__(self, log_path: Path):
        self.log_path = log_path
        self.pid: int | None = None
        self.returncode: int | None = None
        self._ended = threading.Event()

    def ended(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked server pid {self.pid}", timeout)
        return self.returncode


class ServerForker:
    """``python -m jobs.serving.forkserver MODULE`` started by this task, and what it forked.

    ``env`` is the forker's own environment (what MODULE's import may read, and what
    ``/proc/PID/environ`` shows for every server forked from it); each server gets its own
    whole environment with its request."""

    def __init__(self, python: str, module: str, env: dict[str, str], log_path: Path):
        self.python = python
        self.module = module
        self.env = env
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None
        self._next_id = 0
        self._asked: dict[int, ForkedProcess] = {}  # by request id, until forked
        self._forked: dict[int, ForkedProcess] = {}  # by pid, until ended
        self._lock = threading.Lock()

    def command(self) -> list[str]:
        return forker_command([self.python, MODULE_FLAG, self.module])

    def can_fork(self, cmd: list[str]) -> bool:
        """Whether ``cmd`` is ``python -m MODULE ...`` with this forker's python and module."""
        return cmd[:3] == [self.python, MODULE_FLAG, self.module]

    def start(self) -> ServerForker:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        parent = os.getpid()
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(),
                env={**os.environ, **self.env},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                preexec_fn=lambda: prepare_server_process(None, parent),
            )
        threading.Thread(target=self._read_replies, name="forker-replies", daemon=True).start()
        return self

    def fork(
        self, argv: list[str], env: dict[str, str], log_path: Path, cpus: list[int]
    ) -> ForkedProcess:
        """Ask for a server running ``python -m MODULE argv`` in ``env`` (its whole
        environment), logging to ``log_path``, pinned to ``cpus``; returned at once, forked
        once the module is imported."""
        handle = ForkedProcess(Path(log_path))
        with self._lock:
            request_id, self._next_id = self._next_id, self._next_id + 1
            self._asked[request_id] = handle
            gone = self.proc is None or self.proc.poll() is not None
        request = {"id": request_id, "argv": argv, "env": env, "log": str(log_path), "cpus": cpus}
        if not gone:
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                gone = True
        if gone:
            with self._lock:
                mine = self._asked.pop(request_id, None)  # else the reader said it already
            if mine is not None:
                self._never_forked(handle)
        return handle

    def close(self) -> None:
        """No more servers: the forker SIGKILLs what it forked and ends."""
        proc = self.proc
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=CLOSE_GRACE_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()

    def __enter__(self) -> ServerForker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _read_replies(self) -> None:
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(message, dict):
                continue
            with self._lock:
                if "id" in message:
                    handle = self._asked.pop(message["id"], None)
                    if handle is not None:
                        handle.pid = message["pid"]
                        self._forked[handle.pid] = handle
                elif "code" in message:
                    handle = self._forked.pop(message["pid"], None)
                    if handle is not None:
                        handle.ended(message["code"])
        self._forker_ended()

    def _forker_ended(self) -> None:
        """The forker is gone: what it never forked failed to start; what it forked dies
        with it (their parent-death signal)."""
        code = self.proc.wait()
        with self._lock:
            asked, self._asked = list(self._asked.values()), {}
            forked, self._forked = list(self._forked.values()), {}
        for handle in asked:
            self._never_forked(handle, code)
        for handle in forked:
            _wait_gone(handle.pid)
            handle.ended(-signal.SIGKILL)

    def _never_forked(self, handle: ForkedProcess, code: int | None = None) -> None:
        code = self.proc.poll() if code is None and self.proc else code
        with open(handle.log_path, "a") as log:
            log.write(
                f"pdbench: the process that imports {self.module} for this task's servers "
                f"ended (code {code}) before it could fork this one; its log: {self.log_path}\n"
                + log_tail(self.log_path, 20)
                + "\n"
            )
        handle.ended(code if code else 1)


def _wait_gone(pid: int | None, timeout_s: float = 5.0) -> None:
    """Until ``pid`` no longer runs (its parent-death signal takes a moment; an ended
    process whose parent is gone waits as a zombie until init reaps it)."""
    deadline = time.monotonic() + timeout_s
    while pid is not None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.05)
