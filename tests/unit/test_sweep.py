"""Which compositions of a -m sweep are submitted at once and followed at its end."""

from __future__ import annotations

import pytest

from pdbench.config.schema import Command, ExecutorKind, RunConfig
from pdbench.driver.sweep import Sweep

pytestmark = pytest.mark.unit


def test_a_sweep_submits_now_only_slurm_runs():
    cfg = RunConfig(dir="/r", cache_dir="/c")
    assert not Sweep.takes(cfg)  # local: one composition after another
    cfg.cluster.executor = ExecutorKind.slurm
    assert Sweep.takes(cfg)
    cfg.launch.dry_run = True
    assert not Sweep.takes(cfg)
    cfg.launch.dry_run, cfg.command = False, Command.status
    assert not Sweep.takes(cfg)
    assert Sweep().finish()  # nothing submitted: nothing to follow
