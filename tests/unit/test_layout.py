"""KV-cache geometry and descriptor lists, against numbers computed by hand."""

from __future__ import annotations

import pytest

from connector.layout import (
    KVLayout,
    KVShape,
    RankCache,
    TPSplit,
    block_transfer,
    dtype_nbytes,
    kv_bytes_per_token,
    rank_heads,
)

pytestmark = pytest.mark.unit

# 2 layers, 4 KV heads, head_dim 2, 2-byte dtype, 2-token blocks:
# cell = 2 (K,V) * 2 * 2 = 8 bytes; a TP1 page = 4 heads * 2 tokens * 8 = 64 bytes.
TOY = KVShape(num_layers=2, num_kv_heads=4, head_dim=2, dtype_bytes=2, block_size=2)


def test_llama31_8b_bf16_bytes_per_token():
    assert kv_bytes_per_token(32, 8, 128, 2) == 131072
    shape = KVShape(32, 8, 128, dtype_nbytes("bfloat16"), block_size=16)
    assert shape.bytes_per_token == 131072
    assert shape.bytes_per_block == 2 * 1024 * 1024  # 16 tokens * 128 KiB


@pytest.mark.parametrize(
    ("name", "nbytes"),
    [
        ("float32", 4),
        ("fp32", 4),
        ("bfloat16", 2),
        ("float16", 2),
        ("half", 2),
        ("fp8", 1),
        ("float8_e4m3fn", 1),
        ("torch.bfloat16", 2),
    ],
)
def test_dtype_nbytes(name, nbytes):
    assert dtype_nbytes(name) == nbytes


def test_dtype_nbytes_unknown():
    with pytest.raises(ValueError, match="int3"):
        dtype_nbytes("int3")


def test_kv_bytes_per_token_rejects_zero():
    with pytest.raises(ValueError, match="num_kv_heads"):
        kv_bytes_per_token(32, 0, 128, 2)


def test_blocks_for_rounds_up():
    assert TOY.blocks_for(1) == 1
    assert TOY.blocks_for(2) == 1
    assert TOY.blocks_for(5) == 3


def test_tp_split_parse_and_ratio():
    split = TPSplit.parse("2->8")
    assert (split.p_tp, split.d_tp, split.ratio) == (2, 8, 4)
    assert str(split) == "2->8"


@pytest.mark.parametrize("text", ["2->1", "2->3", "4->2"])
def test_tp_split_rejects_fan_in_and_non_multiples(text):
    p, d = text.split("->")
    with pytest.raises(ValueError) as err:
        TPSplit.parse(text)
    message = str(err.value)
    assert f"P TP={p}" in message and f"D TP={d}" in message
    assert "multiple of prefill TP" in message


def test_tp_split_rejects_garbage():
    with pytest.raises(ValueError, match="P->D"):
        TPSplit.parse("1:2")


def test_rank_heads_split_and_replicated():
    assert rank_heads(8, 2, 1) == (4, 4)
    assert rank_heads(2, 4, 3) == (1, 1)  # 4 ranks over 2 heads: each holds one copy
    with pytest.raises(ValueError, match="evenly"):
        rank_heads(8, 3, 0)


def test_rank_cache_regions():
    cache = RankCache(TOY, KVLayout.HND, heads=4, num_blocks=3)
    assert cache.page_bytes == 64
    assert cache.block_bytes == 128
    assert cache.nbytes == 384
    assert cache.regions() == [(0, 192), (192, 192)]
    assert cache.page_offset(1, 2) == 192 + 128


def test_homogeneous_pull_is_one_descriptor_per_layer_and_block():
    for layout in KVLayout:
        xfer = block_transfer(
            TOY, layout, TPSplit(1, 1), 0, [0, 1], [2, 0], d_num_blocks=2, p_num_blocks=3
        )
        assert xfer.local == [(0, 64, 0), (64, 64, 0), (128, 64, 0), (192, 64, 0)]
        assert xfer.remote == [(128, 64, 0), (0, 64, 0), (320, 64, 0), (192, 64, 0)]
        assert xfer.nbytes == 2 * xfer.bytes_per_block == 256


def test_hnd_hetero_pull_reads_one_head_slice_per_page():
    # D rank 1 of 2 holds heads 2..3: at 2 heads * 2 tokens * 8 = 32 bytes into each P page.
    xfer = block_transfer(
        TOY,
        KVLayout.HND,
        TPSplit(1, 2),
        1,
        [0, 1],
        [2, 0],
        d_num_blocks=2,
        p_num_blocks=3,
        d_device=1,
        p_device=5,
    )
    assert xfer.p_rank == 0
    assert xfer.local == [(0, 32, 1), (32, 32, 1), (64, 32, 1), (96, 32, 1)]
    assert xfer.remote == [(160, 32, 5), (32, 32, 5), (352, 32, 5), (224, 32, 5)]
    assert xfer.bytes_per_block == 64
    assert xfer.nbytes == 128


def test_nhd_hetero_pull_reads_one_run_per_token():
    # P page [2 tokens, 4 heads, 8 B]: token t's heads 2..3 sit at t*32 + 16, 16 bytes long.
    xfer = block_transfer(
        TOY, KVLayout.NHD, TPSplit(1, 2), 1, [0], [2], d_num_blocks=1, p_num_blocks=3
    )
    assert xfer.local == [(0, 16, 0), (16, 16, 0), (32, 16, 0), (48, 16, 0)]
    assert xfer.remote == [(144, 16, 0), (176, 16, 0), (336, 16, 0), (368, 16, 0)]
    assert xfer.descriptors == 4  # layers * blocks * tokens
    assert xfer.nbytes == xfer.bytes_per_block == 64


def test_hetero_p_tp2_d_tp4_rank3_reads_from_p_rank1():
    xfer = block_transfer(
        TOY, KVLayout.HND, TPSplit(2, 4), 3, [0], [0], d_num_blocks=1, p_num_blocks=1
    )
    # P rank 1 holds heads 2..3 (page 2*2*8 = 32 B); D rank 3 holds head 3: second half.
    assert xfer.p_rank == 1
    assert xfer.remote == [(16, 16, 0), (48, 16, 0)]
    assert xfer.local == [(0, 16, 0), (16, 16, 0)]


def test_descs_per_block_cuts_runs_without_changing_bytes():
    one = block_transfer(
        TOY, KVLayout.HND, TPSplit(1, 1), 0, [0], [1], d_num_blocks=1, p_num_blocks=2
    )
    eight = block_transfer(
        TOY,
        KVLayout.HND,
        TPSplit(1, 1),
        0,
        [0],
        [1],
        d_num_blocks=1,
        p_num_blocks=2,
        descs_per_block=8,
    )
    assert eight.descriptors == 8 * one.descriptors == 16
    assert eight.nbytes == one.nbytes == 128
    assert eight.remote[:2] == [(64, 8, 0), (72, 8, 0)]
    with pytest.raises(ValueError, match="equal descriptors"):
        block_transfer(
            TOY,
            KVLayout.HND,
            TPSplit(1, 1),
            0,
            [0],
            [1],
            d_num_blocks=1,
            p_num_blocks=2,
            descs_per_block=3,
        )


def test_block_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="outside the cache"):
        block_transfer(
            TOY, KVLayout.HND, TPSplit(1, 1), 0, [0], [3], d_num_blocks=1, p_num_blocks=3
        )
