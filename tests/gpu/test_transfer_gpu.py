"""The transfer bench on GPU memory: two tasks, VRAM buffers, NIXL over UCX (cuda_ipc et al.)."""

from __future__ import annotations

import pytest

from connector.bench_config import MemoryKind
from jobs.entry.transfer_bench import bench_spec, kv_shape, load_records
from pdbench.config.schema import ModelConfig, RunConfig
from pdbench.driver.transfer_bench import run_transfer_bench

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def vram_run(tmp_path) -> RunConfig:
    cfg = RunConfig(dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"))
    cfg.model = ModelConfig(
        name="llama3_8b_shape", num_layers=32, hidden_size=4096, num_attention_heads=32,
        num_kv_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
        dtype="bfloat16",
    )  # fmt: skip
    # Validated like every launch, which wants a model to serve and room for the 1p1d
    # topology (the bench serves none; its two tasks are the two "nodes").
    cfg.model.generate = True
    cfg.server.block_size = 16
    cfg.cluster.gpus_per_node = 1
    cfg.cluster.nodes = 2
    cfg.cluster.time_limit_min = 10
    cfg.bench.memory = MemoryKind.VRAM
    cfg.bench.tokens = [128, 2048]
    cfg.bench.tp_splits = ["1->1", "1->4"]
    cfg.bench.iterations = 5
    return cfg


def test_vram_bench_moves_intact_kv_and_names_its_transport(tmp_path):
    cfg = vram_run(tmp_path)
    spec = bench_spec(cfg)
    run_transfer_bench(cfg)
    records = load_records(cfg.dir)
    assert {r.record_id for r in records} == {c.record_id for c in spec.cases}
    shape = kv_shape(cfg)
    for r in records:
        assert r.status == "ok", r.error
        assert r.memory == "VRAM"
        assert r.integrity_ok is True
        assert r.bytes == r.blocks * shape.bytes_per_block // r.d_tp
        assert r.memcpy_gb_s > 0 and r.gb_s > 0
        assert r.ucx_transports, "UCX named no transport for a VRAM transfer"
        # A TCP data path between GPUs must never pass unflagged (UCX's silent fallback).
        if any(t.startswith("tcp") for t in r.ucx_transports):
            assert r.flag and "tcp_data_path" in r.flag_reasons
