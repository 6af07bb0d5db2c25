"""Every preset of every group, and every experiment, composes into a typed RunConfig."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, ValidationError

from pdbench.config.schema import (
    GROUP_SCHEMAS,
    ExecutorKind,
    Flow,
    Placement,
    RunConfig,
    TrackingBackend,
    register_configs,
)
from pdbench.validate.rules import validate

pytestmark = pytest.mark.unit

CONF = Path(__file__).resolve().parents[2] / "conf"


def presets(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_run(overrides: list[str] = (), conf: Path = CONF, hydra_cfg: bool = False):
    """Compose ``config.yaml`` as the CLI does (schemas registered, Hydra state cleared)."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
            return compose("config", overrides=list(overrides), return_hydra_config=hydra_cfg)
    finally:
        GlobalHydra.instance().clear()


def typed(overrides: list[str] = (), conf: Path = CONF) -> RunConfig:
    """Typed as ``__main__`` does it, with ``${hydra:...}`` resolvable as in a Hydra app."""
    dcfg = compose_run(overrides, conf, hydra_cfg=True)
    HydraConfig.instance().set_config(dcfg)
    try:
        with open_dict(dcfg):
            del dcfg["hydra"]
        cfg = OmegaConf.to_object(dcfg)
    finally:
        HydraConfig.instance().cfg = None
    assert isinstance(cfg, RunConfig)
    return cfg


def test_default_composes_to_the_cpu_demo():
    cfg = typed()
    assert cfg.cluster.executor is ExecutorKind.local
    assert cfg.model.name == "tiny_llama" and cfg.model.generate
    assert cfg.topology.placement is Placement.same_node
    assert cfg.flow.flows == [Flow.agg, Flow.recompute, Flow.pull]
    assert cfg.tracking.backend is TrackingBackend.none
    assert cfg.dir.startswith("results/run-")
    assert cfg.cache_dir


@pytest.mark.parametrize(
    ("group", "name"), [(g, n) for g in GROUP_SCHEMAS for n in presets(g)], ids=str
)
def test_every_preset_composes_typed(group, name):
    cfg = typed([f"{group}={name}"])
    assert isinstance(getattr(cfg, group), GROUP_SCHEMAS[group])


def test_every_group_has_presets():
    for group in GROUP_SCHEMAS:
        assert presets(group), group


@pytest.mark.parametrize("name", presets("experiment"))
def test_every_experiment_composes_typed(name):
    cfg = typed([f"+experiment={name}"])
    assert cfg.name.startswith(name)
    assert cfg.dir.startswith(f"results/{cfg.name}-")


def test_smoke_is_small_and_valid_here():
    cfg = typed(["+experiment=smoke"])
    w = cfg.workload
    assert max(w.conversations) * w.turns <= 16 and w.user_tokens <= 128
    assert cfg.model.num_layers <= 4 and cfg.model.generate
    assert validate(cfg) == []


def test_model_presets_match_their_kv_shape():
    tiny = typed(["model=tiny_llama"]).model
    assert tiny.resolved_head_dim == 32 and tiny.dtype == "float32"
    for name in ("llama3_8b", "llama3_70b"):
        m = typed([f"model={name}"]).model
        assert (m.num_kv_heads, m.resolved_head_dim, m.vocab_size) == (8, 128, 128256)
        assert not m.generate and m.path.startswith("meta-llama/")


# h100_8gpu sets HF_HUB_OFFLINE=1: hub ids must be in a cache; these are shared directories.
SHARED_8B = "model.path=/shared/models/Llama-3.1-8B-Instruct"
SHARED_70B = "model.path=/shared/models/Llama-3.1-70B-Instruct"


@pytest.mark.parametrize(
    "overrides",
    [
        ["topology=1p1d"],
        ["topology=1p1d_tp1", "transport=tcp", "flow=pd"],
        ["topology=1p1d", "flow=decode_first"],
        ["topology=agg", "flow=agg"],
        ["topology=p2_d4", "model=llama3_8b", "cluster=h100_8gpu", "transport=nvlink", SHARED_8B],
        [
            "topology=1p1d_tp4",
            "model=llama3_70b",
            "cluster=h100_8gpu",
            "transport=nvlink",
            SHARED_70B,
        ],
        [
            "topology=1p1d_tp4_cross",
            "model=llama3_70b",
            "cluster=h100_8gpu",
            "transport=rdma",
            SHARED_70B,
        ],
        [
            "topology=2p2d_cross",
            "model=llama3_8b",
            "cluster=h100_8gpu",
            "transport=rdma",
            SHARED_8B,
        ],
        ["topology=1p1d", "model=llama3_8b", "cluster=h100_8gpu", "workload=long_doc", SHARED_8B],
        ["topology=1p1d", "model=llama3_8b", "cluster=h100_8gpu", "workload=agentic", SHARED_8B],
    ],
    ids=lambda o: ",".join(o),
)
def test_presets_that_belong_together_validate(overrides):
    cfg = typed(overrides)
    assert [str(p) for p in validate(cfg)] == []


@pytest.mark.parametrize(
    "override",
    [
        "model.num_layerz=3",  # typo'd key
        "model.num_layers=two",  # wrong type
        "topology.placement=sideways",  # not an enum name
        "flow.flows=[agg,pul]",  # not a Flow
        "cluster.executor=kubernetes",
    ],
)
def test_override_typo_or_wrong_type_fails_at_compose(override):
    with pytest.raises((ConfigCompositionException, ValidationError, ConfigKeyError)):
        compose_run([override])


@pytest.fixture
def conf_copy(tmp_path) -> Path:
    dst = tmp_path / "conf"
    shutil.copytree(CONF, dst)
    return dst


@pytest.mark.parametrize(
    ("body", "fails_on"),
    [("num_layerz: 2\n", "num_layerz"), ("num_layers: two\n", "num_layers")],
)
def test_preset_file_typo_or_wrong_type_fails_at_compose(conf_copy, body, fails_on):
    tiny = (conf_copy / "model" / "tiny_llama.yaml").read_text()
    (conf_copy / "model" / "bad.yaml").write_text(tiny + body)
    with pytest.raises(Exception) as info:
        OmegaConf.to_object(compose_run(["model=bad"], conf_copy))
    assert fails_on in str(info.value)


def test_optional_local_file_is_merged_when_present(conf_copy):
    (conf_copy / "local").mkdir()
    (conf_copy / "local" / "default.yaml").write_text(
        "# @package _global_\ncluster:\n  account: my-account\n"
    )
    assert typed([], conf_copy).cluster.account == "my-account"
    assert typed([], CONF).cluster.account == ""  # absent: nothing merged, no error


def test_hydra_writes_nothing_into_the_working_directory():
    hydra = compose_run(hydra_cfg=True).hydra
    assert hydra.run.dir == "."
    assert hydra.output_subdir is None
    assert hydra.job.chdir is False
    assert "file" not in hydra.job_logging.handlers


def test_a_multirun_shares_one_run_dir():
    # Hydra copies the sweep's resolver cache into each job: equal `now` patterns in `dir` and
    # `hydra.sweep.dir` give every job of one `-m` sweep the same run directory.
    raw = yaml.safe_load((CONF / "config.yaml").read_text())
    pattern = re.compile(r"\$\{now:([^}]*)\}")
    run_dir, sweep_dir = raw["dir"], raw["hydra"]["sweep"]["dir"]
    assert set(pattern.findall(run_dir)) == set(pattern.findall(sweep_dir)) != set()
