"""First-principles cost of a Llama-shaped model: parameters, prefill FLOPs, KV bytes.

Pure arithmetic. KV bytes come from ``connector.layout`` (the one place that defines the
cache geometry); parameters and FLOPs are counted here:

- a decoder layer holds Q and O projections (``hidden x heads*head_dim`` each), K and V
  (``hidden x kv_heads*head_dim`` each), a gated MLP (``3 x hidden x intermediate``) and two
  RMSNorm weights (``hidden`` each); the model adds the input embedding, a final norm and
  an untied LM head (``vocab x hidden`` each);
- prefilling the token at position ``i`` costs ``2 x`` the layer matmul parameters (one
  multiply-add each) plus attention over ``i`` earlier tokens: ``QK^T`` and ``AV`` are
  ``2 x heads*head_dim`` FLOPs per key and layer each, so ``4 x layers x heads*head_dim x i``;
  the LM head runs once per request (last position only), the embedding is a lookup.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from conf import model_sections
from connector.layout import dtype_nbytes, kv_bytes_per_token, parameters_of
from records.model import ModelShape as RecordedShape


@dataclass(frozen=True)
class ModelShape(RecordedShape):
    """The model's shape as records carry it (``records.model``: declared there once) with
    the cost arithmetic of this module."""

    @property
    def layer_matmul_params(self) -> int:
        h = self.hidden_size
        attn = 2 * h * self.q_dim + 2 * h * self.kv_dim
        return attn + 3 * h * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def params(self) -> int:
        """Every weight: layers (matmuls + 2 norms), final norm, embedding, LM head."""
        return parameters_of(self)

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(
            self.num_layers, self.num_kv_heads, self.head_dim, dtype_nbytes(self.dtype)
        )

    def flops_per_token(self, context: float = 0.0) -> float:
        """FLOPs to prefill one token that attends to ``context`` earlier tokens."""
        linear = 2.0 * self.num_layers * self.layer_matmul_params
        return linear + 4.0 * self.num_layers * self.q_dim * context

    def prefill_flops(self, tokens: float, start: float = 0.0) -> float:
        """FLOPs to prefill ``tokens`` tokens after ``start`` cached ones (+ one LM head)."""
        if tokens <= 0:
            return 0.0
        linear = 2.0 * self.num_layers * self.layer_matmul_params * tokens
        # sum over positions start .. start+tokens-1 of 4 * L * q_dim * position
        positions = tokens * start + tokens * (tokens - 1) / 2.0
        attention = 4.0 * self.num_layers * self.q_dim * positions
        return linear + attention + 2.0 * self.embedding_params


def known_shapes(conf_dir: Path | None = None) -> dict[str, ModelShape]:
    """Every ``conf/model/*.yaml`` that holds a full shape, by file stem (a schema-only or
    partial file is left out), read by the conf package's own reader."""
    return dict(_shapes(str(conf_dir) if conf_dir else ""))


@functools.cache
def _shapes(folder: str) -> dict[str, ModelShape]:
    out = {}
    for stem, section in model_sections(Path(folder) if folder else None).items():
        try:
            out[stem] = ModelShape.from_dict(section)
        except (ValueError, TypeError):
            continue
    return out


def shape(name: str) -> ModelShape:
    """The shape of ``conf/model/<name>.yaml``; KeyError names the known ones."""
    shapes = _shapes("")
    if name not in shapes:
        raise KeyError(f"model {name!r} not in conf/model ({', '.join(sorted(shapes))})")
    return shapes[name]
