"""benchmarks/run_cpu.py: a run's processes are told apart by what they are, forked servers
by their depth below the forker (they all carry its command line)."""

from __future__ import annotations

import pytest

from benchmarks.run_cpu import Sample, by_kind, kind_of

pytestmark = pytest.mark.unit

PY = "/venv/bin/python"
FORK = f"{PY} -m jobs.serving.forkserver vllm.entrypoints.openai.api_server"
SERVER = f"{PY} -m vllm.entrypoints.openai.api_server --model /m"  # server.cpu_start=exec


def run_tree() -> dict[int, Sample]:
    rows = [
        Sample(10, 1, f"{PY} -m pdbench +experiment=smoke dir=/r", 0.7),
        Sample(11, 10, f"{PY} -u -m submitit.core._submit /r/submitit", 1.1),
        Sample(12, 11, FORK, 6.0),
        Sample(13, 12, FORK, 2.5),  # P's API server
        Sample(14, 12, FORK, 2.4),  # D's
        Sample(15, 13, FORK, 4.5),  # their engine cores
        Sample(16, 14, FORK, 3.5),
        Sample(17, 11, f"{PY} -m jobs.serving.router --config /r/router.json", 0.8),
        Sample(18, 10, f"{PY} -m connector.ucx_probe", 1.3),
        Sample(19, 11, "/bin/sh -c true", 0.01),
    ]
    return {s.pid: s for s in rows}


def test_forked_servers_are_named_by_their_depth_below_the_forker():
    samples = run_tree()
    assert kind_of(samples[12], samples).startswith("server forker")
    assert kind_of(samples[13], samples) == "vLLM API server"
    assert kind_of(samples[16], samples) == "vLLM engine core"
    assert kind_of(samples[17], samples) == "router"
    assert kind_of(samples[19], samples) == "other"


def test_a_server_started_on_its_own_and_its_engine_core_are_told_apart():
    samples = {s.pid: s for s in [Sample(20, 11, SERVER, 2.5), Sample(21, 20, SERVER, 4.0)]}
    assert kind_of(samples[20], samples) == "vLLM API server"
    assert kind_of(samples[21], samples) == "vLLM engine core"


def test_cpu_is_summed_per_kind_the_most_first():
    cpu, count = by_kind(run_tree())
    assert list(cpu)[0] == "vLLM engine core" and cpu["vLLM engine core"] == 8.0
    assert count["vLLM API server"] == 2 and cpu["vLLM API server"] == 4.9
    assert cpu["driver"] == 0.7 and count["job (controller and task)"] == 1
    assert sum(count.values()) == 10
