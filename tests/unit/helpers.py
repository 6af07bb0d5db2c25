"""Typed configs for unit tests, built without Hydra."""

from __future__ import annotations

from pdbench.config.schema import (
    ClusterConfig,
    ExecutorKind,
    KvBufferDevice,
    ModelConfig,
    Placement,
    RoleSpec,
    RunConfig,
    TopologyConfig,
    TransportConfig,
)
from records.bench import TransferRecord


def tiny_model() -> ModelConfig:
    return ModelConfig(
        name="tiny_llama",
        generate=True,
        num_layers=2,
        hidden_size=256,
        num_attention_heads=4,
        num_kv_heads=2,
        intermediate_size=512,
        vocab_size=512,
        max_model_len=2048,
        dtype="float32",
    )


def llama3_8b() -> ModelConfig:
    return ModelConfig(
        name="llama3_8b",
        path="/models/Llama-3.1-8B-Instruct",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_kv_heads=8,
        intermediate_size=14336,
        vocab_size=128256,
        max_model_len=131072,
        dtype="bfloat16",
    )


def cpu_run(**overrides) -> RunConfig:
    cfg = RunConfig(dir="/RUN", cache_dir="/CACHE", model=tiny_model())
    cfg.cluster = ClusterConfig(cpus_per_node=2)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def gpu_run(p_tp=1, d_tp=1, p=1, d=1, placement=Placement.same_node, nodes=1) -> RunConfig:
    cfg = RunConfig(dir="/RUN", cache_dir="/CACHE", model=llama3_8b())
    cfg.cluster = ClusterConfig(
        name="h100", executor=ExecutorKind.slurm, nodes=nodes, gpus_per_node=8
    )
    cfg.topology = TopologyConfig(
        name=f"{p}p{d}d", prefill=RoleSpec(p, p_tp), decode=RoleSpec(d, d_tp), placement=placement
    )
    cfg.transport = TransportConfig(
        name="rdma", kv_buffer_device=KvBufferDevice.cuda, ucx_tls="rc,cuda_copy"
    )
    cfg.server.block_size = 16
    return cfg


def one_pass(cfg: RunConfig) -> RunConfig:
    """``cfg`` measuring each Point once (one repetition, as a pipeline test runs it): for the
    tests that count a plan's Points (the schema's default is 3 repetitions)."""
    cfg.workload.repetitions = 1
    return cfg


def planted_policy_for(target, t0_ms: float = 12.0):
    """A policy for a deployment like ``target`` (``PolicyTarget``) with a planted cost model:
    a pull costs P ``t0_ms``, recomputing 0.1 ms a history token (so the rule pulls histories
    above ``10 * t0_ms`` tokens at every load); one band, threshold 128."""
    from pdbench.results.interval import Interval
    from pdbench.results.policy_file import (
        DeploymentPolicy,
        Policy,
        PullCost,
        RecomputeRate,
        ThresholdBand,
    )

    t = target
    band = ThresholdBand(
        1, 1, None, 128, Interval(128), Interval(10 * t0_ms), "crossing", "decided"
    )
    entry = DeploymentPolicy(
        "planted",
        f"{t.model} (planted)",
        t.model,
        t.transport,
        t.tp_prefill,
        t.tp_decode,
        t.topology_class,
        "placement",
        t.block_size,
        PullCost(Interval(t0_ms), Interval(0.0)),
        [RecomputeRate(1, Interval(10_000.0))],
        [band],
    )
    return Policy(["planted"], [entry])


def planted_policy(cfg: RunConfig, path):
    """``planted_policy_for`` ``cfg``'s deployment, written to ``path``: what ``flow=policy``
    presets need to validate."""
    from pdbench.plan.deployments import policy_target
    from pdbench.results import policy_file

    target = policy_target(cfg.model, cfg.topology, cfg.transport, cfg.server)
    return policy_file.write(path, planted_policy_for(target))


def bench_record(**fields) -> TransferRecord:
    """A transfer-bench record as ``connector.bench.runner`` writes one, ``fields`` changed."""
    base = dict(
        record_id="r",
        status="ok",
        model="m",
        dtype="bfloat16",
        num_layers=2,
        num_kv_heads=2,
        head_dim=32,
        dtype_bytes=2,
        block_size=32,
        layout="HND",
        tp_split="1->1",
        p_tp=1,
        d_tp=1,
        d_rank=0,
        p_rank=0,
        tokens=256,
        blocks=8,
        bytes=8 * 16384,
        bytes_per_block=16384,
        descriptors=32,
        descs_per_block=1,
        merge_descriptors=True,
        op="READ",
        initiator="reader",
        memory="DRAM",
        block_order="scattered",
        ucx_tls="",
    )
    return TransferRecord(**{**base, **fields})
