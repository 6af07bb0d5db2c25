"""A process that imports a server's Python module once and forks each server from it.

``python -m jobs.serving.forkserver MODULE`` imports MODULE (vLLM's API server: ~10 of the
~15 CPU-seconds a CPU server takes to start), then reads requests on stdin, one JSON line
each: ``{"id", "argv", "env", "log", "cpus"}``. For each it forks a child that becomes the
server, as ``python -m MODULE ARGV`` would: its own session, ``env`` as its whole
environment, stdout and stderr appended to ``log``, stdin from /dev/null, pinned to
``cpus``, SIGKILLed when this process dies (which dies with the task that started it), then
MODULE run as ``__main__``. Replies on its stdout (which nothing else writes to: what the
import prints goes to stderr, its log), one JSON line each: ``{"id", "pid"}`` per fork,
``{"pid", "code"}`` when a child ends (its return code as ``subprocess`` gives it: ``-N``
for a signal). EOF on stdin ends it: its children are SIGKILLed first.

The task side is ``jobs.serving.forker``. Requests that arrive while MODULE is still being
imported wait in the pipe: servers are asked for at once and forked when it is ready.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import select
import signal
import sys

from connector.parent_death import die_with_parent

POLL_S = 0.2  # how often ended children are looked for between requests


def reply(replies: int, message: dict) -> None:
    """One JSON line to the task (written whole: never through ``sys.stdout``'s buffer, which
    a child would inherit and flush into its log)."""
    os.write(replies, (json.dumps(message) + "\n").encode())


def return_code(status: int) -> int:
    """``waitpid``'s status as ``subprocess`` reports it: the exit code, or -signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def reap(children: set[int], replies: int) -> None:
    """Report every child that has ended (and stop watching it)."""
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            children.discard(pid)
            continue
        if done:
            children.discard(pid)
            reply(replies, {"pid": pid, "code": return_code(status)})


def prepare_server_process(cpus: list[int] | None, parent: int) -> None:
    """Set up a server's process before it starts, started on its own (``Popen``'s
    ``preexec_fn``) or forked here: it dies with ``parent`` (``die_with_parent``); SLURM
    sends its time-limit warning (``--signal=USR2@...``) to every process of the job step,
    servers included, and they must stay up while the job checkpoints and stops them; pin it
    to ``cpus`` (its children inherit them), those of them the task may use, and say so on
    stderr, its log, when that leaves none (it then runs where the task may)."""
    die_with_parent(parent)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if cpus:
        allowed = set(cpus) & os.sched_getaffinity(0)
        if allowed:
            os.sched_setaffinity(0, allowed)
        else:
            os.write(2, f"pdbench: cores {cpus} are outside this task's; not pinned\n".encode())


def become_server(module: str, request: dict, forker: int, replies: int) -> None:
    """In the forked child: set up the process as the task would have, then run ``module``
    as ``python -m module`` runs it (returns when it returns; SystemExit propagates)."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.close(replies)  # the forker's end of the task's pipe is not the server's
    prepare_server_process(request.get("cpus"), forker)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [module, *request["argv"]]  # run_module puts the module's path first
    # Run as ``python -m`` runs it: its code again, as ``__main__`` (what it imports is
    # imported already), not the copy imported under its own name.
    sys.modules.pop(module, None)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def serve(module: str, replies: int) -> int:
    """Fork a server per request until stdin ends, then end (never returns); in a child,
    returns once the server's module has run (its exit code: 0)."""
    children: set[int] = set()
    pending = b""
    me = os.getpid()
    while True:
        readable, _, _ = select.select([0], [], [], POLL_S)
        if readable:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    become_server(module, request, me, replies)
                    return 0
                children.add(pid)
                reply(replies, {"id": request["id"], "pid": pid})
        reap(children, replies)
    for pid in children:  # the task is done with them: nothing outlives it
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in children:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    sys.stderr.flush()
    # Ended at once: the interpreter's own end after importing vLLM takes ~3 s, added to
    # every deployment's teardown; nothing is left to flush or clean up here.
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    (module,) = sys.argv[1:] if argv is None else argv
    replies = os.dup(1)  # replies only on the pipe; anything printed goes to the log
    os.dup2(2, 1)
    importlib.import_module(module)
    sys.stdout.flush()  # nothing the import buffered is inherited by a child's log
    sys.stderr.flush()
    return serve(module, replies)


if __name__ == "__main__":
    sys.exit(main())
