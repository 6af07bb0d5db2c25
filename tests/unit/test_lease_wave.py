"""A lease that cannot outlast a GPU prefill wave is refused (issue 23): the wave's expected
time from the model's shape and ``cluster.gpu_tflops``, against the router's pull window."""

from __future__ import annotations

import pytest

from pdbench.cli import compose_job
from pdbench.plan.kv_lease import pull_window_s
from pdbench.plan.prefill_wave import (
    PREFILL_MFU,
    decoder_parameters,
    prefill_flops,
    prefill_wave,
)
from pdbench.validate.premises import check_lease_outlasts_a_wave
from pdbench.validate.rules import validate
from tests.unit.helpers import llama3_8b

pytestmark = pytest.mark.unit

# The issue's example: flows' 15 s TTL with long_doc's 8 x 32k-token prompts on H100s.
LONG_DOC_ON_H100 = (
    "+experiment=flows",
    "workload=long_doc",
    "cluster=h100_8gpu",
    "model=llama3_8b",
    "model.path=/shared/models/Llama-3.1-8B-Instruct",
)


def test_flows_long_doc_on_h100s_with_a_15_s_ttl_is_refused_with_a_ttl_that_covers_the_wave():
    cfg = compose_job(list(LONG_DOC_ON_H100))
    (problem,) = check_lease_outlasts_a_wave(cfg)
    line = str(problem)
    assert line.startswith("flow.decoder_kv_blocks_ttl_s=15: the router lets P pull for 7.0 s")
    assert "8 prefill(s) of 32832 tokens on one P (TP 1) take about 12.0 s" in line
    assert "cluster.gpu_tflops=989" in line and "recompute under the name pull" in line
    assert "Fix: a TTL that covers the wave: 22 s or more" in line
    assert line in [str(p) for p in validate(cfg)]
    # the TTL the fix names passes: its window covers the wave
    fixed = compose_job([*LONG_DOC_ON_H100, "flow.decoder_kv_blocks_ttl_s=22"])
    assert check_lease_outlasts_a_wave(fixed) == []
    assert pull_window_s(22) > prefill_wave(fixed, 32768).seconds > pull_window_s(21)


@pytest.mark.parametrize(
    "override",
    [
        "cluster.gpu_tflops=0",  # unknown GPU: nothing to estimate
        "workload.concurrency=4",  # half the wave
        "topology=p2_d4",  # P of TP 2: half the wave
        "launch.check_premises=false",
    ],
)
def test_an_unknown_gpu_a_smaller_wave_or_opting_out_passes(override):
    assert check_lease_outlasts_a_wave(compose_job([*LONG_DOC_ON_H100, override])) == []


def test_cpu_runs_have_no_gpu_tflops_and_are_not_estimated():
    cfg = compose_job(["+experiment=flows"])
    assert cfg.cluster.gpu_tflops == 0 and prefill_wave(cfg, 1024) is None


def test_prefill_flops_are_the_decoder_weights_twice_per_token_plus_causal_attention():
    model = llama3_8b()
    params = decoder_parameters(model)
    assert 6.9e9 < params < 7.0e9  # Llama 3 8B without its 2 x 0.5B embeddings
    tokens = 32768
    attention = 2.0 * 32 * tokens**2 * 4096
    assert prefill_flops(model, tokens) == pytest.approx(2.0 * params * tokens + attention)
    # attention grows with the square: at 32k it is over a third of the work
    assert attention / prefill_flops(model, tokens) > 0.35


def test_tp_and_more_p_instances_shorten_the_wave():
    one = compose_job(list(LONG_DOC_ON_H100))
    base = prefill_wave(one, 8192)
    assert base.prompts == 8 and base.tokens == 8192 + 64
    assert base.seconds == pytest.approx(
        8 * prefill_flops(one.model, base.tokens) / (989e12 * PREFILL_MFU)
    )
    tp2 = compose_job([*LONG_DOC_ON_H100, "topology=1p1d_tp4"])
    assert prefill_wave(tp2, 8192).seconds == pytest.approx(base.seconds / 4)
