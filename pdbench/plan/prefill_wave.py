"""How long P takes to prefill a wave of prompts, from the model's shape and the GPU (pure).

A rough model, stated as such: a long prefill is compute-bound, so its time is its FLOPs over
what P's GPUs deliver. FLOPs of one prompt of ``L`` tokens: 2 per decoder weight per token
(the LM head runs for the last token only) plus causal attention's two ``L x L`` products
(``2 L^2 d`` per layer, ``d`` = heads x head_dim). Delivered: ``cluster.gpu_tflops`` (dense
bf16 peak of one GPU; 0: unknown, nothing is estimated) x P's TP x ``PREFILL_MFU``, an
assumption, not a measurement: long prefills reach about half the dense peak; a faster P
only shortens the wave.

A *wave*: every conversation in flight sends its first prompt (common prefix, history and a
user message) at once; the router spreads conversations over the P instances, each P
prefills its share back to back. ``pdbench.validate.premises`` refuses a lease shorter than
that; the dry run's Points-per-attempt line (``pdbench.plan.attempt``) uses the same model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdbench.config.schema import ModelConfig, RunConfig

PREFILL_MFU = 0.5  # assumed share of cluster.gpu_tflops a long prefill reaches


def decoder_parameters(model: ModelConfig) -> int:
    """Weights every prompt token goes through: the decoder layers (no embeddings, no LM
    head: a prefill computes logits for its last token only)."""
    total = model.parameter_count()
    embeddings = model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings else 2)
    return total - embeddings - model.hidden_size


def prefill_flops(model: ModelConfig, tokens: int) -> float:
    """FLOPs of prefilling one prompt of ``tokens`` tokens (from an empty cache)."""
    attention_width = model.num_attention_heads * model.resolved_head_dim
    linear = 2.0 * decoder_parameters(model) * tokens
    attention = 2.0 * model.num_layers * tokens * tokens * attention_width
    return linear + attention


@dataclass(frozen=True)
class Wave:
    """One wave of first prompts on one P instance, and how long it takes."""

    prompts: int  # prompts each P instance prefills back to back
    tokens: int  # tokens of each
    p_tp: int
    gpu_tflops: float
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.prompts} prefill(s) of {self.tokens} tokens on one P (TP {self.p_tp}) "
            f"take about {self.seconds:.1f} s at {self.gpu_tflops:g} TFLOPS per GPU and "
            f"{PREFILL_MFU:.0%} MFU (assumed)"
        )


def prefill_seconds(model: ModelConfig, tokens: int, p_tp: int, gpu_tflops: float) -> float:
    """Seconds one P of TP ``p_tp`` takes to prefill one prompt of ``tokens`` tokens."""
    delivered = gpu_tflops * 1e12 * max(1, p_tp) * PREFILL_MFU
    return prefill_flops(model, tokens) / delivered


def in_flight(cfg: RunConfig) -> int:
    """The most conversations a Point of ``cfg`` has in flight at once."""
    w = cfg.workload
    return min(max(w.concurrency), max(w.conversations))


def first_prompt_tokens(cfg: RunConfig, history: int) -> int:
    """A conversation's first prompt at history length ``history``."""
    return cfg.workload.common_prefix_tokens + history + cfg.workload.user_tokens


def prefill_wave(cfg: RunConfig, history: int) -> Wave | None:
    """The first wave of a Point at history length ``history`` on one P instance; None when
    the GPU's TFLOPS are unknown (``cluster.gpu_tflops`` 0, as on CPU) or there is no P."""
    p = cfg.topology.prefill
    if cfg.cluster.gpu_tflops <= 0 or p.count < 1:
        return None
    prompts = math.ceil(in_flight(cfg) / p.count)
    tokens = first_prompt_tokens(cfg, history)
    seconds = prompts * prefill_seconds(cfg.model, tokens, p.tp, cfg.cluster.gpu_tflops)
    return Wave(prompts, tokens, p.tp, cfg.cluster.gpu_tflops, seconds)
