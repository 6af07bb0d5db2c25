"""Hydra's private names pdbench relies on, all here: the argument parser ``@hydra.main``
itself uses (``pdbench.cli`` splits a command line as Hydra would, without composing).
``tests/unit/test_submitit_private.py`` fails when an upgrade moves it, and on a private
Hydra name used anywhere else."""

from __future__ import annotations

import argparse

PARSER = "hydra._internal.utils.get_args_parser"


def args_parser() -> argparse.ArgumentParser:
    """Hydra's command-line parser (``--cfg``, ``-m``, ``--info``, overrides...)."""
    from hydra._internal.utils import get_args_parser  # lazy: hydra (~0.4 s), not for --help

    return get_args_parser()
