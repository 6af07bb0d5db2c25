"""A command line's jobs composed from ``conf/`` once, typed: what the pre-check validates is
what runs.

``Composer`` composes one job per set of overrides with Hydra's compose API, as
``python -m pdbench`` would in a run or a ``-m`` sweep: every job of one command line shares
the values resolved once per launch (``${now:...}``: the jobs of a sweep share a run dir, as
Hydra's multirun hands each job the sweep's resolver cache), and ``${hydra:...}`` resolves as
in a job. It also keeps what Hydra sets up for a job that runs: its logging
(``hydra/job_logging``, ``hydra.verbose``), applied by ``configure_logging``.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from pdbench.config.overrides import as_lists
from pdbench.config.schema import RunConfig, register_configs
from pdbench.config.tree import CONF_DIR, ROOT_CONFIG


class Composer:
    """Composes the jobs of one command line, in order."""

    def __init__(self) -> None:
        self._first: DictConfig | None = None  # the first job's config: its resolver cache
        self.job_logging: Any = None  # the first job's hydra.job_logging
        self.verbose: Any = False  # and its hydra.verbose

    def __call__(self, overrides: list[str]) -> RunConfig:
        """One job's typed config; Hydra's and OmegaConf's exceptions say what is wrong. A
        sweep axis given one value is the list of one it is (``overrides.as_lists``)."""
        from hydra import compose, initialize_config_dir  # lazy: hydra (~0.4 s), not for --help
        from hydra.core.global_hydra import GlobalHydra  # lazy: as above
        from hydra.core.hydra_config import HydraConfig  # lazy: as above

        register_configs()
        overrides = as_lists(overrides)
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                dcfg = compose(ROOT_CONFIG, overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(dcfg)  # ${hydra:...} resolves as in a job
            hydra = dcfg.hydra
            with open_dict(dcfg):
                del dcfg["hydra"]
            if self._first is not None:
                OmegaConf.copy_cache(from_config=self._first, to_config=dcfg)
            cfg = OmegaConf.to_object(dcfg)
        finally:
            HydraConfig.instance().cfg = None
            GlobalHydra.instance().clear()
        if self._first is None:
            self._first, self.job_logging, self.verbose = dcfg, hydra.job_logging, hydra.verbose
        return cfg

    def configure_logging(self) -> None:
        """Python logging as Hydra sets it up for a job (``conf/config.yaml``: stdout)."""
        from hydra.core.utils import configure_log  # lazy: as above

        if self.job_logging is not None:
            configure_log(self.job_logging, self.verbose)


def compose_job(overrides: list[str]) -> RunConfig:
    """One job's typed config, composed from ``conf/`` as ``python -m pdbench`` does."""
    return Composer()(overrides)
