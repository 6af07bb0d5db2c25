"""The transfer bench's pure parts: sweep planning, records, flags, UCX tables, verification."""

from __future__ import annotations

import pytest

from connector.bench_config import BlockOrder, TransferBenchConfig, XferOp
from connector.bench_plan import pending_cases, plan_bench
from connector.bench_record import flag_reasons, format_table, quantile
from connector.layout import KVLayout, KVShape
from connector.ucx_proto import data_transports, parse_proto_info
from pdbench.config.compose import compose_job
from pdbench.spec.transfer_bench import bench_spec
from tests.unit.helpers import bench_record

pytestmark = pytest.mark.unit

LLAMA = KVShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, block_size=32)
TINY = KVShape(num_layers=2, num_kv_heads=2, head_dim=32, dtype_bytes=4, block_size=32)


def plan(bench: TransferBenchConfig, shape: KVShape = LLAMA, **kw):
    return plan_bench(bench, model="m", dtype="bfloat16", shape=shape, backends=["UCX"], **kw)


def test_plan_is_the_product_of_the_axes():
    spec = plan(TransferBenchConfig())
    # 1 UCX variant x 2 ops x 2 layouts x 2 splits x 1 descs/block x 3 token counts
    assert len(spec.cases) == 24
    assert len({c.record_id for c in spec.cases}) == 24
    assert [c.index for c in spec.cases] == list(range(24))
    assert spec.num_blocks == 4096 // 32
    # P rank 0 of TP1 holds all 8 heads: 32 layers x 128 blocks x 32 tokens x 8 x 512 B.
    assert spec.owner_bytes() == 512 * 2**20
    assert spec.reader_bytes() == 512 * 2**20  # the 1->1 split needs a full D rank too


def test_record_ids_are_stable_and_depend_on_what_is_measured():
    a = plan(TransferBenchConfig(tokens=[256]))
    b = plan(TransferBenchConfig(tokens=[256]))
    assert [c.record_id for c in a.cases] == [c.record_id for c in b.cases]
    c = plan(TransferBenchConfig(tokens=[256], iterations=99))  # how long, not what
    assert [x.record_id for x in c.cases] == [x.record_id for x in a.cases]
    d = plan(TransferBenchConfig(tokens=[256], ucx_tls=["tcp"]))
    assert not {x.record_id for x in d.cases} & {x.record_id for x in a.cases}
    e = plan(TransferBenchConfig(tokens=[256], merge_descriptors=False))
    assert not {x.record_id for x in e.cases} & {x.record_id for x in a.cases}


def test_ucx_variants_default_to_the_transport_setting():
    cfg = compose_job(["+experiment=transfer_bench", "transport=tcp"])
    assert cfg.bench.ucx_tls == ["tcp"] and bench_spec(cfg).variants() == ["tcp"]
    given = compose_job(["+experiment=transfer_bench", 'bench.ucx_tls=["",rc]'])
    assert bench_spec(given).variants() == ["", "rc"]
    spec = plan(TransferBenchConfig(ucx_tls=["", "tcp", "tcp"]))
    assert spec.variants() == ["", "tcp"]
    assert len(spec.cases) == 48


def test_plan_lists_every_problem():
    bench = TransferBenchConfig(tp_splits=["2->1", "1->3"], tokens=[0], iterations=0)
    with pytest.raises(ValueError) as err:
        plan(bench)
    text = str(err.value)
    assert "P TP=2 -> D TP=1" in text
    assert "3 KV heads" not in text and "TP=3" in text
    assert "bench.tokens=0: is not >= 1. Fix: " in text
    assert "bench.iterations" in text


def test_plan_rejects_descriptors_not_made_of_whole_words():
    # NHD 1->2 runs are 1 head x 32 head_dim x 2 (K,V) x 4 B = 256 B; / 128 = 2 B pieces.
    bench = TransferBenchConfig(layouts=[KVLayout.NHD], descs_per_block=[128])
    with pytest.raises(ValueError, match="4-byte words"):
        plan(bench, shape=TINY)


def test_block_ids_scattered_are_a_seeded_sample_and_contiguous_are_a_range():
    spec = plan(TransferBenchConfig(tokens=[64, 320]), shape=TINY)
    case = next(c for c in spec.cases if c.tokens == 64)
    d_blocks, p_blocks = spec.block_ids(case)
    assert len(d_blocks) == len(p_blocks) == 2
    assert all(0 <= b < spec.num_blocks == 10 for b in d_blocks + p_blocks)
    assert spec.block_ids(case) == (d_blocks, p_blocks)
    contiguous = plan(TransferBenchConfig(tokens=[64], block_order=BlockOrder.contiguous))
    assert contiguous.block_ids(contiguous.cases[0]) == ([0, 1], [0, 1])


def test_timed_d_rank_and_integrity_ranks():
    spec = plan(TransferBenchConfig(tp_splits=["2->8"], tokens=[32]))
    case = spec.cases[0]
    assert case.d_ranks == [0, 1, 2, 3]
    assert case.timed_d_rank == 3
    xfer = spec.transfer(case, case.timed_d_rank)
    assert xfer.p_rank == 0
    assert xfer.bytes_per_block == LLAMA.bytes_per_block // 8


def test_pending_cases_drops_recorded_ones():
    spec = plan(TransferBenchConfig(tokens=[32, 64]))
    done = {spec.cases[0].record_id, spec.cases[3].record_id}
    left = pending_cases(spec, done)
    assert len(left.cases) == len(spec.cases) - 2
    assert not done & {c.record_id for c in left.cases}


def test_quantile_interpolates():
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0], 0.9) == 10.0
    assert quantile([7.0], 0.9) == 7.0


def _flags(**kw):
    args = dict(
        gb_s=5.0,
        memcpy_gb_s=10.0,
        expected_gb_s=0.0,
        nbytes=1 << 30,
        ratio=0.1,
        min_bytes=1 << 20,
        transports=["cma/memory"],
        ucx_tls="",
        integrity_ok=True,
    )
    args.update(kw)
    return flag_reasons(**args)


def test_flags():
    assert _flags() == []
    assert _flags(gb_s=0.5) == ["below_memcpy"]
    assert _flags(gb_s=0.5, nbytes=1000) == []  # latency-bound sizes are not judged
    assert _flags(gb_s=30.0, memcpy_gb_s=2000.0, expected_gb_s=400.0) == [
        "below_memcpy",
        "below_expected",
    ]
    assert _flags(integrity_ok=False) == ["integrity_failed"]
    # UCX fell back to TCP silently: flagged; asked for on purpose: not.
    assert _flags(transports=["tcp/eth0"]) == ["tcp_data_path"]
    assert _flags(transports=["tcp/eth0"], ucx_tls="tcp") == []
    assert _flags(transports=["tcp/eth0"], ucx_tls="rc,cuda_copy") == ["tcp_data_path"]


def test_format_table_has_one_column_per_token_count():
    base = dict(
        op="READ",
        ucx_tls="",
        layout="HND",
        tp_split="1->2",
        descs_per_block=1,
        status="ok",
        memcpy_gb_s=10.0,
        backend="UCX",
        ucx_transports=["cma/memory"],
        descriptors=64,
        flag=False,
    )
    records = [
        bench_record(**base, tokens=256, gb_s=3.5),
        bench_record(**{**base, "flag": True}, tokens=1024, gb_s=0.25),
        bench_record(**{**base, "status": "failed"}, tokens=4096, gb_s=0.0),
    ]
    lines = format_table(records).splitlines()
    assert lines[0].split() == [
        "op",
        "ucx_tls",
        "layout",
        "split",
        "d/blk",
        "256",
        "tok",
        "1024",
        "tok",
        "4096",
        "tok",
        "memcpy",
        "transport",
        "descs@max",
    ]
    assert lines[2].split() == [
        "READ",
        "-",
        "HND",
        "1->2",
        "1",
        "3.50",
        "0.25!",
        "x",
        "10.00",
        "UCX:cma/memory",
        "64",
    ]
    assert format_table([]) == "(no transfer-bench records)"


UCX_LOG = """\
[1795381539.48] [vm:7332 :0]   +--------+-------------+-----------------------------------+
[1795381539.48] [vm:7332 :0]   | pdb-reader-v0 self cfg#0                                 |
[1795381539.48] [vm:7332 :0]   | remote memory read by ucp_get* from host memory to host |
[1795381539.48] [vm:7332 :0]   +--------+-------------+-----------------------------------+
[1795381539.48] [vm:7332 :0]   | Range  | Description |              Config               |
[1795381539.48] [vm:7332 :0]   +--------+-------------+-----------------------------------+
[1795381539.48] [vm:7332 :0]   | 0..inf | zero-copy   | cma/memory                        |
[1795381539.48] [vm:7332 :0]   +--------+-------------+-----------------------------------+
+--------+-------------+-------------------------------------------+
| pdb-reader-v0 inter-node cfg#2                                   |
| remote memory read by ucp_get*(multi) into host memory from host |
+--------+-------------+-------------------------------------------+
| Range  | Description |                  Config                   |
+--------+-------------+-------------------------------------------+
| 0..8K  | zero-copy   | tcp/eth0                                  |
| 8K..inf| zero-copy   | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 |
+--------+-------------+-------------------------------------------+
| pdb-owner-v0 inter-node cfg#1                                   |
| remote memory write by ucp_put* from cuda memory to cuda |
+--------+-------------+-------------------------------------------+
| Range  | Description |                  Config                   |
| 0..inf | zero-copy   | cuda_ipc/cuda                             |
| pdb-reader-v0 inter-node cfg#2                                   |
| active message by ucp_am_send* from host memory |
| 0..inf | short   | tcp/eth0                             |
"""


def test_ucx_proto_tables():
    tables = parse_proto_info(UCX_LOG)
    assert [(t.context, t.scope) for t in tables] == [
        ("pdb-reader-v0", "self"),
        ("pdb-reader-v0", "inter-node"),
        ("pdb-owner-v0", "inter-node"),
        ("pdb-reader-v0", "inter-node"),
    ]
    assert tables[1].transports == ["tcp/eth0", "rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1"]
    # self (loopback) tables and active messages are not the data path
    assert data_transports(tables, "pdb-reader-v0", "READ") == [
        "rc_mlx5/mlx5_0:1",
        "rc_mlx5/mlx5_1:1",
        "tcp/eth0",
    ]
    assert data_transports(tables, "pdb-reader-v0", "WRITE") == []
    assert data_transports(tables, "pdb-owner-v0", "WRITE") == ["cuda_ipc/cuda"]
    assert parse_proto_info("no tables here\n") == []


def test_verify_catches_a_misplaced_run():
    torch = pytest.importorskip("torch")
    from connector.bench import kv_buffer

    owner = torch.zeros(64, dtype=torch.uint8)
    kv_buffer.fill_pattern(owner)
    assert owner.view(torch.int32).tolist() == list(range(16))
    reader = torch.zeros(32, dtype=torch.uint8)
    kv_buffer.poison(reader)
    local, remote = [(0, 8, 0), (8, 8, 0)], [(40, 8, 0), (16, 8, 0)]
    assert not kv_buffer.verify(reader, local, remote)  # poisoned: nothing arrived
    reader[0:8] = owner[40:48]
    reader[8:16] = owner[16:24]
    assert kv_buffer.verify(reader, local, remote)
    reader[8:16] = owner[20:28]  # the second run read 4 bytes too far
    assert not kv_buffer.verify(reader, local, remote)
    with pytest.raises(ValueError, match="4-byte"):
        kv_buffer.verify(reader, [(2, 8, 0)], [(0, 8, 0)])


def test_ops_enum_values_match_nixl():
    assert [op.value for op in XferOp] == ["READ", "WRITE"]
