"""The NIXL progress thread's poll timeout: chosen per platform, set on the real NIXL agent."""

from __future__ import annotations

import sys

import pytest

from connector.plugin.nixl_progress import CPU_DELAY_US, agent_progress_delay, progress_delay_us
from connector.process_env import NIXL_PROGRESS_DELAY_ENV

pytestmark = pytest.mark.unit


def test_cpu_servers_get_a_timeout_gpu_servers_keep_nixls_busy_loop():
    assert progress_delay_us({}, on_cpu=True) == CPU_DELAY_US > 0
    assert progress_delay_us({}, on_cpu=False) is None


@pytest.mark.parametrize("on_cpu", [True, False])
def test_the_environment_sets_it_on_either_platform(on_cpu):
    assert progress_delay_us({NIXL_PROGRESS_DELAY_ENV: "0"}, on_cpu) == 0
    assert progress_delay_us({NIXL_PROGRESS_DELAY_ENV: " 250 "}, on_cpu) == 250


@pytest.mark.parametrize("given", ["-1", "1.5", "1ms"])
def test_a_bad_value_names_the_variable_and_what_it_takes(given):
    with pytest.raises(ValueError, match=f"{NIXL_PROGRESS_DELAY_ENV}=.*whole microseconds"):
        progress_delay_us({NIXL_PROGRESS_DELAY_ENV: given}, on_cpu=True)


def nixl_api():
    api = pytest.importorskip("nixl._api")
    return api.nixl_agent, sys.modules[api.nixl_agent.__module__].nixlBind


def test_agents_built_inside_get_the_timeout_and_nothing_changes_after():
    agent_class, bindings = nixl_api()
    original = bindings.nixlAgent
    with agent_progress_delay(agent_class, 700) as applied:
        assert applied
        config = bindings.nixlAgentConfig()
        config.pthrDelay = 0  # what nixl_agent sets
        bindings.nixlAgent("pdbench-test-direct", config)
        assert config.pthrDelay == 700
        agent = agent_class("pdbench-test-agent")  # NIXL's own constructor path, UCX and all
        assert "UCX" in agent.backends
    assert bindings.nixlAgent is original
    config = bindings.nixlAgentConfig()
    config.pthrDelay = 0
    bindings.nixlAgent("pdbench-test-after", config)
    assert config.pthrDelay == 0


def test_no_timeout_asked_leaves_nixl_alone():
    agent_class, bindings = nixl_api()
    original = bindings.nixlAgent
    with agent_progress_delay(agent_class, None) as applied:
        assert not applied and bindings.nixlAgent is original
