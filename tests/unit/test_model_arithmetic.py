"""Model arithmetic has one home (connector.layout): element sizes, KV bytes per token and
parameter counts agree wherever they are used (validation, the transfer bench, analysis)."""

from __future__ import annotations

import pytest

from connector.layout import (
    dtype_nbytes,
    kv_bytes_per_token,
    kv_heads_per_rank,
    model_dtype_nbytes,
)
from pdbench.config.compose import compose_job
from pdbench.spec.transfer_bench import kv_shape
from pdbench.validate import capacity, model_memory

pytestmark = pytest.mark.unit


def test_fp8_is_one_byte_and_auto_is_the_checkpoints_bfloat16():
    assert dtype_nbytes("fp8") == model_dtype_nbytes("fp8") == 1
    assert dtype_nbytes("float") == dtype_nbytes("float32") == 4
    assert model_dtype_nbytes("auto") == dtype_nbytes("bfloat16") == 2
    with pytest.raises(ValueError, match="unknown KV dtype 'auto'"):
        dtype_nbytes("auto")  # a KV layout needs an element size the name fixes


def test_llama3_8b_has_8_billion_parameters_and_128_kib_of_kv_per_token():
    cfg = compose_job(["model=llama3_8b"])
    m = cfg.model
    assert 8.02e9 < capacity.parameter_count(m) < 8.04e9  # Meta's model card: 8.03 B
    assert capacity.weight_bytes(m) == capacity.parameter_count(m) * 2
    assert capacity.kv_bytes_per_token(m) == 32 * 2 * 8 * 128 * 2 == 131072
    assert kv_shape(cfg).bytes_per_token == capacity.kv_bytes_per_token(m)
    need = model_memory.gpu_need(m, tp=2)
    assert need.weights_gib * 2 * capacity.GIB == pytest.approx(capacity.weight_bytes(m))


def test_kv_heads_split_over_ranks_or_replicate():
    assert kv_heads_per_rank(8, 2) == 4 and kv_heads_per_rank(8, 16) == 1
    assert kv_bytes_per_token(1, kv_heads_per_rank(8, 4), 64, 2) == 2 * 2 * 64 * 2
