"""Closed sets are Enums: composition itself refuses a value outside them, naming the setting,
the choices and the closest one, whether the value comes from the command line or a YAML
file; a value that goes out (vLLM flags, W&B, records) stays the text it was."""

from __future__ import annotations

import json

import pytest
from hydra.errors import ConfigCompositionException

from pdbench.config.compose import compose_job
from pdbench.config.schema import (
    Dtype,
    KvBufferDevice,
    KvLoadFailurePolicy,
    LengthDistribution,
    OnFailure,
    TrackingMode,
)
from tests.unit.test_cli import usage_error

pytestmark = pytest.mark.unit

TYPOS = [
    ("server.kv_load_failure_policy", "recompte", "recompute"),
    ("launch.on_failure", "stpo", "stop"),
    ("model.dtype", "bfloat61", "bfloat16"),
    ("transport.kv_buffer_device", "cdua", "cuda"),
    ("tracking.mode", "offlne", "offline"),
    ("workload.length_distribution", "lognormla", "lognormal"),
]


@pytest.mark.parametrize(("key", "typo", "meant"), TYPOS)
def test_a_value_outside_a_closed_set_is_refused_with_the_closest(key, typo, meant):
    text = usage_error(f"{key}={typo}")
    assert f"{key}={typo}: '{typo}' is not one of" in text
    assert f"did you mean {meant}" in text
    with pytest.raises(ConfigCompositionException):
        compose_job([f"{key}={typo}"])  # composition itself refuses it


def test_a_yaml_value_outside_a_closed_set_names_the_setting_and_the_closest(tmp_path, monkeypatch):
    import shutil

    from pdbench.config import compose

    conf = tmp_path / "conf"
    shutil.copytree(compose.CONF_DIR, conf)
    (conf / "local").mkdir(exist_ok=True)
    (conf / "local" / "default.yaml").write_text(
        "# @package _global_\nlaunch:\n  on_failure: stpo\n"
    )
    monkeypatch.setattr(compose, "CONF_DIR", conf)
    text = usage_error()
    assert "Invalid value 'stpo', expected one of [continue, stop]" in text
    assert "Fix: launch.on_failure=stop (one of continue, stop)" in text


def test_closed_set_values_are_their_own_text():
    cfg = compose_job(["+experiment=smoke", "launch.on_failure=stop", "model.dtype=half"])
    assert cfg.launch.on_failure is OnFailure.stop and cfg.model.dtype is Dtype.half
    assert f"--dtype {cfg.model.dtype}" == "--dtype half"
    assert cfg.server.kv_load_failure_policy is KvLoadFailurePolicy.recompute  # CPU default
    assert json.dumps([cfg.transport.kv_buffer_device, cfg.tracking.mode]) == ('["cpu", "offline"]')
    assert cfg.workload.length_distribution is LengthDistribution.uniform
    assert {KvBufferDevice.cuda, TrackingMode.online} == {"cuda", "online"}
