"""The shape of a Llama-like model, declared once: what a run's records say of its model.

The run config's ``ModelConfig`` (``pdbench.config.schema``) takes these fields as settings
(with their bounds) and gives them back as a ``ModelShape`` (``ModelConfig.shape``); every
Point record carries the model section it ran with (``deployment.model``), which the
analysis reads into this type; the analysis adds the cost arithmetic on top
(``analysis.method.model_cost``); ``conf/model/*.yaml`` are named shapes
(``conf.model_sections``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# the sizes a shape cannot do without (``head_dim`` 0: hidden / heads)
REQUIRED = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "intermediate_size",
    "vocab_size",
)


@dataclass(frozen=True)
class ModelShape:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int  # resolved: never 0 (``from_dict`` computes hidden / heads)
    intermediate_size: int
    vocab_size: int
    dtype: str = "bfloat16"
    tie_word_embeddings: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelShape:
        """From a model section (a record's, a config's, a conf/model file's); ``ValueError``
        names the sizes it lacks."""
        missing = [k for k in REQUIRED if not d.get(k)]
        if missing:
            raise ValueError(f"model {d.get('name', '?')!r} lacks {', '.join(missing)}")
        heads = int(d["num_attention_heads"])
        return cls(
            name=str(d.get("name", "")),
            num_layers=int(d["num_layers"]),
            hidden_size=int(d["hidden_size"]),
            num_attention_heads=heads,
            num_kv_heads=int(d["num_kv_heads"]),
            head_dim=int(d.get("head_dim") or 0) or int(d["hidden_size"]) // heads,
            intermediate_size=int(d["intermediate_size"]),
            vocab_size=int(d["vocab_size"]),
            dtype=str(d.get("dtype") or "bfloat16"),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim
