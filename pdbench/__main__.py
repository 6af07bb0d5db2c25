"""``python -m pdbench +experiment=NAME [overrides]`` and ``python -m pdbench status dir=RUN``."""

from __future__ import annotations

import sys

from pdbench.cli import dispatch
from pdbench.config import RunConfig, register_configs


def _rewrite_argv(argv: list[str]) -> list[str]:
    """``status`` as a verb and ``run.dir=``/``run.name=`` as aliases of ``dir=``/``name=``."""
    out = []
    for arg in argv:
        if arg in ("status", "run", "transfer_bench"):
            out.append(f"command={arg}")
        elif arg.startswith(("run.dir=", "run.name=")):
            out.append(arg[len("run.") :])
        else:
            out.append(arg)
    return out


def main() -> None:
    import hydra  # lazy: hydra only when a run is composed (~0.4 s)
    from omegaconf import DictConfig, OmegaConf  # lazy: with hydra, only when a run is composed

    register_configs()

    @hydra.main(config_path="../conf", config_name="config", version_base="1.3")
    def entry(dcfg: DictConfig) -> None:
        cfg: RunConfig = OmegaConf.to_object(dcfg)  # typed once, here
        dispatch(cfg)

    sys.argv = [sys.argv[0], *_rewrite_argv(sys.argv[1:])]
    entry()


if __name__ == "__main__":
    main()
