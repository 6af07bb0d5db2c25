"""Start this task's vLLM servers and (task 0) the router, each owned by the run's
``ExitStack``: torn down, process group and all, however the run ends."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from connector.shared_files import write_json_atomic
from jobs.run.state import TaskState
from jobs.serving.forker import ServerForker
from jobs.serving.server import ServerProcess, wait_all_ready
from pdbench.spec.launch import InstanceSpec, RouterSpec

ROUTER_READY_S = 60.0  # the router is a small Python process


def say(line: str) -> None:
    print(f"[pdbench] {line}", flush=True)


def start_forker(stack: ExitStack, mine: list[InstanceSpec], log_path: str) -> ServerForker | None:
    """The process this node's forked servers (``InstanceSpec.forked``: CPU servers under
    ``server.cpu_start=fork``) are forked from (``jobs.serving.forker``); None where none
    is forked. Its environment holds what they all share (the run dir included)."""
    forked = [i for i in mine if i.forked]
    if not forked:
        return None
    shared = {k: v for k, v in forked[0].env.items() if all(i.env.get(k) == v for i in forked)}
    python, _, module = forked[0].command[:3]  # python -m MODULE (server_fork.forkable)
    forker = ServerForker(python, module, shared, Path(log_path))
    return stack.enter_context(forker)


def start_servers(
    stack: ExitStack,
    mine: list[InstanceSpec],
    task: TaskState,
    startup_timeout_s: float,
    forker: ServerForker | None = None,
) -> dict[str, str]:
    """Start the instances placed on this node (forked from ``forker`` where it can) and
    wait until all answer ``/health``; the URL of each, by name. ``ServerStartError``
    (with the log tail) when one cannot."""
    procs: list[tuple[InstanceSpec, ServerProcess]] = []
    for inst in mine:
        proc = ServerProcess(
            name=f"{inst.name} (node {task.rank})",
            cmd=inst.command,
            env=inst.env,
            log_path=Path(inst.log_path),
            health_url=inst.health_url,
            cpus=inst.cpus,
            forker=forker if inst.forked else None,
        )
        stack.enter_context(proc)
        procs.append((inst, proc))
        task.procs.append(proc)
    took = wait_all_ready([proc for _, proc in procs], startup_timeout_s, say)
    for inst, proc in procs:
        say(f"{inst.name} healthy on {inst.host}:{inst.http_port} in {took[proc.name]:.0f} s")
    return {inst.name: inst.url for inst, _ in procs}


def start_router(stack: ExitStack, spec: RouterSpec, task: TaskState) -> str:
    """Write the router's config, start it and wait until it answers; its URL."""
    write_json_atomic(Path(spec.config_path), spec.config)
    router = ServerProcess(
        name="router",
        cmd=spec.command,
        env=spec.env,
        log_path=Path(spec.log_path),
        health_url=spec.health_url,
        grace_s=5.0,
    )
    stack.enter_context(router)
    task.procs.append(router)
    router.wait_until_ready(ROUTER_READY_S)
    return spec.url
