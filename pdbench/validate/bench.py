"""The transfer bench's settings (``command=transfer_bench``): every case it would run can be
laid out for this model, checked before the job is submitted (``connector.bench_plan``)."""

from __future__ import annotations

from connector.bench_plan import bench_problems
from connector.layout import KVShape
from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import Command, RunConfig
from pdbench.spec.transfer_bench import bench_placement, kv_shape


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
    problems = [
        ConfigProblem(p.field, p.value, p.message, p.fix) for p in bench_problems(cfg.bench, shape)
    ]
    return problems + gpu_bench_problems(cfg, shape)


def gpu_bench_problems(cfg: RunConfig, shape: KVShape) -> list[ConfigProblem]:
    """What a GPU cluster's transfer bench could not measure: pdbench's tiny model (a few
    MiB of KV say nothing of a GPU link), a link inside a node with fewer than two GPUs."""
    gpus = cfg.cluster.gpus_per_node
    if gpus <= 0:
        return []
    out = []
    if cfg.model.generate and not cfg.model.path:
        largest = shape.bytes_per_token * max(cfg.bench.tokens, default=0)
        out.append(
            ConfigProblem(
                "model",
                cfg.model.name,
                f"is pdbench's tiny generated model: its largest transfer is "
                f"{largest / 2**20:.1f} MiB, which times a GPU link's latency, not its "
                "bandwidth",
                "a real model's shape: model=llama3_8b (the bench needs its shape, not its "
                "weights)",
            )
        )
    place = bench_placement(cfg)
    if place.nodes == 1 and gpus < place.tasks_per_node:
        out.append(
            ConfigProblem(
                "cluster.gpus_per_node",
                gpus,
                f"transport={cfg.transport.name} runs both tasks on one node, one GPU each",
                "a node of 2 GPUs or more (cluster.gpus_per_node=2), or transport=rdma "
                "between two nodes",
            )
        )
    return out
