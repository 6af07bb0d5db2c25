"""``python -m pdbench [VERB] [+experiment=NAME] [key=value ...]``; ``--help`` says more.

Before Hydra starts a job, every job of the command line is composed and validated
(``pdbench.cli.precheck``): a bad key, preset or value prints its message alone and exits
2. ``--debug`` (or ``PDBENCH_DEBUG=1``) shows the traceback instead, Hydra's included.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

DEBUG_FLAG = "--debug"
DEBUG_ENV = "PDBENCH_DEBUG"
USAGE_EXIT = 2


def _debug(argv: list[str]) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _fail(err: BaseException, debug: bool) -> None:
    if debug:
        raise err
    print(f"pdbench: {err}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def _run_hydra(argv: list[str], debug: bool) -> None:
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from pdbench.cli import dispatch
    from pdbench.config import RunConfig, register_configs
    from pdbench.validate import ConfigError

    register_configs()

    @hydra.main(config_path="../conf", config_name="config", version_base="1.3")
    def entry(dcfg: DictConfig) -> None:
        cfg: RunConfig = OmegaConf.to_object(dcfg)  # typed once, here
        try:
            dispatch(cfg)
        except ConfigError as err:
            _fail(err, debug)

    if debug:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    sys.argv = [sys.argv[0], *argv]
    entry()


def main() -> None:
    argv = sys.argv[1:]
    debug = _debug(argv)
    argv = [a for a in argv if a != DEBUG_FLAG]
    if "-h" in argv or "--help" in argv:
        from pdbench.help import help_page

        print(help_page())
        return
    from pdbench.cli import UsageError, leaves_nothing, parse_argv, precheck, print_checked

    inv = parse_argv(argv)
    jobs = []
    if not inv.show_only:
        try:
            jobs = precheck(inv)
        except UsageError as err:
            _fail(err, debug)
    if inv.check_only:
        print_checked(jobs)
        return
    hydra_argv = inv.argv
    sweep_dir = ""
    if inv.multirun and jobs and leaves_nothing(jobs):
        sweep_dir = tempfile.mkdtemp(prefix="pdbench-sweep-")  # Hydra's folders go here
        hydra_argv = [*hydra_argv, f"hydra.sweep.dir={sweep_dir}"]
    try:
        _run_hydra(hydra_argv, debug)
    finally:
        if sweep_dir:
            shutil.rmtree(sweep_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
