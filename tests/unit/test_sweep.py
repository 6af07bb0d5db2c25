"""Which compositions of a -m sweep are submitted at once and followed at its end."""

from __future__ import annotations

import pytest

from pdbench.cli import submits_now
from pdbench.config.schema import Command, ExecutorKind, RunConfig
from pdbench.driver.launch import finish_sweep

pytestmark = pytest.mark.unit


def test_a_sweep_submits_now_only_slurm_runs():
    cfg = RunConfig(dir="/r", cache_dir="/c")
    assert not submits_now(cfg)  # local: one composition after another
    cfg.cluster.executor = ExecutorKind.slurm
    assert submits_now(cfg)
    cfg.launch.dry_run = True
    assert not submits_now(cfg)
    cfg.launch.dry_run, cfg.command = False, Command.status
    assert not submits_now(cfg)
    assert finish_sweep([])  # nothing submitted: nothing to follow
