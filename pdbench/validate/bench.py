"""The transfer bench's settings (``command=transfer_bench``): every case it would run can be
laid out for this model, checked before the job is submitted (``connector.bench_plan``)."""

from __future__ import annotations

from connector.bench_plan import bench_problems
from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import Command, RunConfig
from pdbench.spec.transfer_bench import kv_shape


def check_transfer_bench(cfg: RunConfig) -> list[ConfigProblem]:
    """The sweep's TP splits, token counts, descriptors and iterations (transfer bench only)."""
    if cfg.command is not Command.transfer_bench:
        return []
    try:
        shape = kv_shape(cfg)
    except ValueError as exc:
        if "dtype" in str(exc):
            fix = "model.dtype=bfloat16 (or float16, float32): the bench needs the element size"
            return [ConfigProblem("model.dtype", cfg.model.dtype, str(exc), fix)]
        fix = "the model's sizes (check_counts names them)"
        return [ConfigProblem("model", cfg.model.name, f"has no KV layout: {exc}", fix)]
    return [
        ConfigProblem(p.field, p.value, p.message, p.fix) for p in bench_problems(cfg.bench, shape)
    ]
