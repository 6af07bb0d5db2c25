"""submitit's private names pdbench relies on, all here (hence ``submitit==1.5.4`` exactly).

submitit has no public API for these: the sbatch script it would submit (the dry run prints
it, ``pdbench.spec.sbatch``), its SLURM node-list parser (``jobs.slurm_env``), the module
its tasks run, and the internals ``pdbench.driver.executors`` subclasses (its job-state
watcher's command and registry, the executor's submission hook). ``missing()`` names each
one an upgrade renamed or dropped; ``tests/unit/test_submitit_private.py`` fails on any, and
on a private submitit name used anywhere else.
"""

from __future__ import annotations

from submitit.slurm import slurm as _slurm

make_sbatch_string = _slurm._make_sbatch_string  # the script submitit would submit
parse_node_list = _slurm._parse_node_list  # SLURM_JOB_NODELIST -> host names
SUBMIT_MODULE = "submitit.core._submit"  # what each SLURM task runs (python -m ...)

# Private attributes of submitit's classes that pdbench.driver.executors overrides or reads.
WATCHER_ATTRIBUTES = ("_make_command", "_registered", "_finished")
EXECUTOR_ATTRIBUTES = ("_internal_process_submissions",)


def missing() -> list[str]:
    """Every private name above this submitit lacks (empty: the pin holds)."""
    import importlib.util  # lazy: only the check needs it

    out = []
    watcher = _slurm.SlurmInfoWatcher(delay_s=1)
    out += [f"SlurmInfoWatcher.{a}" for a in WATCHER_ATTRIBUTES if not hasattr(watcher, a)]
    executor = _slurm.SlurmExecutor
    out += [f"SlurmExecutor.{a}" for a in EXECUTOR_ATTRIBUTES if not hasattr(executor, a)]
    if importlib.util.find_spec(SUBMIT_MODULE) is None:
        out.append(SUBMIT_MODULE)
    return out
