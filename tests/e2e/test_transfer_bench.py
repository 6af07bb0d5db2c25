"""The transfer bench end to end: two real NIXL agents in two submitit tasks, DRAM, UCX."""

from __future__ import annotations

import json

import pytest

from connector.layout import KVLayout, TPSplit, block_transfer
from jobs.entry.transfer_bench import bench_spec, kv_shape, load_records
from pdbench.config.schema import ModelConfig, RunConfig
from pdbench.driver.transfer_bench import run_transfer_bench
from records.bench import TransferRecord
from tests.e2e.conftest import run_pdbench
from tests.e2e.test_local_slurm import local_slurm  # noqa: F401 - the cluster fixture

pytestmark = pytest.mark.e2e

SCHEMA_FIELDS = {
    "model", "layout", "tp_split", "tokens", "blocks", "bytes", "descriptors", "op",
    "median_s", "p90_s", "gb_s", "memcpy_gb_s", "backend", "ucx_tls", "memory",
    "integrity_ok", "flag", "host_owner", "host_reader",
}  # fmt: skip


def small_run(tmp_path) -> RunConfig:
    cfg = RunConfig(dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"))
    cfg.model = ModelConfig(
        name="toy", num_layers=2, hidden_size=128, num_attention_heads=4, num_kv_heads=2,
        intermediate_size=256, vocab_size=512, dtype="float32",
    )  # fmt: skip
    # Validated like every launch, which wants a model to serve (the bench serves none).
    cfg.model.generate = True
    cfg.server.block_size = 32
    cfg.cluster.time_limit_min = 10
    cfg.bench.tokens = [40, 256]  # 40: a partly filled last block
    cfg.bench.tp_splits = ["1->1", "1->2"]
    cfg.bench.descs_per_block = [1, 4]
    cfg.bench.iterations = 3
    cfg.bench.warmup = 1
    cfg.bench.memcpy_min_bytes = 1 << 20
    cfg.bench.rendezvous_timeout_s = 120
    cfg.bench.step_timeout_s = 60
    return cfg


def test_dram_bench_records_every_case_with_intact_data(tmp_path, capsys):
    cfg = small_run(tmp_path)
    spec = bench_spec(cfg)
    out = run_transfer_bench(cfg)

    records = load_records(cfg.dir)
    assert {r.record_id for r in records} == {c.record_id for c in spec.cases}
    assert len(records) == 2 * 2 * 2 * 2 * 2  # ops x layouts x splits x descs/block x tokens
    assert sorted(p.name for p in out.glob("*.json")) == sorted(
        f"{c.record_id}.json" for c in spec.cases
    )
    shape = kv_shape(cfg)
    for r in records:
        assert r.status == "ok", r.error
        assert isinstance(r, TransferRecord)  # read back into its type
        assert r.integrity_ok is True
        assert r.backend == "UCX"
        assert r.memory == "DRAM"
        assert r.blocks == shape.blocks_for(r.tokens)
        split = TPSplit.parse(r.tp_split)
        one_block = block_transfer(
            shape, KVLayout(r.layout), split, r.d_rank, [0], [0],
            d_num_blocks=1, p_num_blocks=1, descs_per_block=r.descs_per_block,
        )  # fmt: skip
        assert r.bytes == r.blocks * one_block.bytes_per_block
        assert r.bytes == r.blocks * shape.bytes_per_block // split.d_tp
        assert r.descriptors == r.blocks * one_block.descriptors
        assert len(r.times_s) == 3 and r.median_s > 0 and r.gb_s > 0
        assert r.p90_s >= r.median_s
        assert r.memcpy_gb_s > 0
        assert r.ucx_transports, "the UCX protocol tables named no transport"
        assert r.host_owner and r.host_reader
        assert r.initiator == ("reader" if r.op == "READ" else "owner")
    # NHD with a head split reads one run per token: block_size times the descriptors of HND.
    by_key = {(r.op, r.layout, r.tp_split, r.descs_per_block, r.tokens): r
              for r in records}  # fmt: skip
    hnd = by_key[("READ", "HND", "1->2", 1, 256)]
    nhd = by_key[("READ", "NHD", "1->2", 1, 256)]
    assert nhd.descriptors == 32 * hnd.descriptors
    assert nhd.bytes == hnd.bytes

    table = capsys.readouterr().out
    assert "READ" in table and "WRITE" in table and "256 tok" in table

    # A rerun of the same run dir finds every case recorded and submits nothing.
    run_transfer_bench(cfg)
    assert "already recorded ok" in capsys.readouterr().out
    assert len(load_records(cfg.dir)) == len(records)


def test_records_are_plain_json_files(tmp_path):
    cfg = small_run(tmp_path)
    cfg.bench.tokens = [64]
    cfg.bench.tp_splits = ["1->2"]
    cfg.bench.layouts = [KVLayout.HND]
    cfg.bench.descs_per_block = [1]
    out = run_transfer_bench(cfg)
    files = sorted(out.glob("*.json"))
    assert len(files) == 2
    for path in files:
        record = json.loads(path.read_text())
        assert set(record) >= SCHEMA_FIELDS
        assert set(record) == set(TransferRecord.__dataclass_fields__)
        assert record["schema_version"] == 1
        assert record["tp_split"] == "1->2" and record["d_rank"] == 1 and record["p_rank"] == 0
    assert not list(out.glob(".*")), "a temp file was left behind"


@pytest.mark.slurm
def test_bench_runs_across_the_two_local_slurm_nodes(local_slurm, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    proc = run_pdbench(
        [
            "+experiment=transfer_bench",
            "cluster=slurm",
            "bench.tokens=[64]",
            "bench.layouts=[HND]",
            'bench.tp_splits=["1->1"]',
            "bench.iterations=2",
            f"dir={run_dir}",
        ],
        900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    records = load_records(str(run_dir))
    assert {r.op for r in records} == {"READ", "WRITE"}
    for r in records:
        assert r.status == "ok" and r.integrity_ok is True, r.error
        # One task per SLURM node: the owner's KV lives on one node, the reader on the other.
        assert {r.host_owner, r.host_reader} == {"node1", "node2"}, r
    submitted = (run_dir / "logs" / "transfer_bench" / "submitit").glob("*_submitted.pkl")
    assert list(submitted), "no SLURM submission"
