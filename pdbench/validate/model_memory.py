"""GPU memory one instance needs: weights per GPU and the KV cache vLLM insists on (pure).

vLLM refuses to start when its KV cache cannot hold one ``max_model_len``-token sequence
("max seq len ... is larger than the maximum number of tokens that can be stored in KV
cache"); the budget it shares between weights, activations and that KV is
``gpu_memory_utilization`` x the GPU's memory. Weights are counted from the model's shape
(a Llama-style decoder: attention, gated MLP, embeddings, norms), split evenly over TP ranks;
an unquantized checkpoint is assumed. Estimates: they reject what cannot fit, they do not
promise what does.
"""

from __future__ import annotations

from dataclasses import dataclass

from connector.layout import model_dtype_nbytes
from pdbench.config.schema import ModelConfig
from pdbench.validate.capacity import kv_bytes_per_token, parameter_count

GIB = 1024**3
# CUDA context, activations of one batch, CUDA graphs, NCCL buffers: a floor, per GPU.
RUNTIME_RESERVE_GIB = 2.0


@dataclass(frozen=True)
class GpuNeed:
    """What one GPU of a ``tp``-way instance needs, in GiB."""

    tp: int
    weights_gib: float
    kv_gib: float  # one max_model_len sequence, this rank's share of the KV heads
    reserve_gib: float = RUNTIME_RESERVE_GIB

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.reserve_gib


def gpu_need(m: ModelConfig, tp: int) -> GpuNeed:
    """Weights per GPU and the KV of one ``max_model_len`` sequence on one rank."""
    weights = parameter_count(m) * model_dtype_nbytes(m.dtype) / tp
    per_token = kv_bytes_per_token(m, tp)
    return GpuNeed(tp=tp, weights_gib=weights / GIB, kv_gib=per_token * m.max_model_len / GIB)


def fits(need: GpuNeed, gpu_memory_gib: float, utilization: float) -> bool:
    return need.total_gib <= gpu_memory_gib * utilization


def max_model_len_that_fits(m: ModelConfig, tp: int, gpu_memory_gib: float, util: float) -> int:
    """The largest ``max_model_len`` whose KV fits next to the weights; 0 if none does."""
    need = gpu_need(m, tp)
    room = gpu_memory_gib * util - need.weights_gib - need.reserve_gib
    if room <= 0 or m.max_model_len <= 0:
        return 0
    per_token_gib = need.kv_gib / m.max_model_len
    return int(room / per_token_gib)
