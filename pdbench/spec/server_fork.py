"""Which servers are forked from their node's server forker, and the forker's command (pure).

Under ``server.cpu_start=fork`` a CPU server started as ``python -m MODULE`` is forked from
one process per node that imported MODULE once (``jobs.serving.forkserver``): vLLM's import
is ~10 of the ~15 CPU-seconds of a CPU server's start. GPU servers are always started on
their own: forking after vLLM's import is not checked on CUDA here.
"""

from __future__ import annotations

from pdbench.config.schema import CpuServerStart

FORKSERVER_MODULE = "jobs.serving.forkserver"
MODULE_FLAG = "-m"  # a forkable server is started as ``python -m MODULE ...``


def forkable(how: CpuServerStart, gpus: tuple[int, ...] | list[int], command: list[str]) -> bool:
    """Whether a server with ``gpus`` started by ``command`` is forked under ``how``."""
    return how == CpuServerStart.fork and not gpus and command[1:2] == [MODULE_FLAG]


def forker_command(server_command: list[str]) -> list[str]:
    """The forker for servers started as ``server_command`` (``python -m MODULE ...``): the
    same python, importing the same module."""
    python, _, module = server_command[:3]
    return [python, MODULE_FLAG, FORKSERVER_MODULE, module]
