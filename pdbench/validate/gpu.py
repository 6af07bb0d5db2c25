"""Validation rules for GPU clusters and KV transports: what would break a first real run.

Each rule is a pure function ``RunConfig -> list[ConfigProblem]`` registered in
``pdbench.validate.rules.RULES`` and reported with every other problem (field, value, what is
wrong, the fix). They read nothing but the config, except ``check_model_reachable``, which
looks at paths on this machine when the executor serves from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from connector.ucx import (
    AM_PEER_FAILURE_TRANSPORTS,
    expand,
    lacks_connectable_am,
    parse_tls,
)
from pdbench.config.problems import ConfigProblem, Problems
from pdbench.config.schema import Command, ExecutorKind, RunConfig
from pdbench.validate.containers import check_container_requeue, check_containers
from pdbench.validate.kv_path import KV_PATH_RULES
from pdbench.validate.model_memory import fits, gpu_need, max_model_len_that_fits
from pdbench.validate.model_source import (
    hub_cache,
    hub_offline,
    hub_repo_dir,
    hub_snapshots,
    is_local_path,
)

ISSUE_NO_AM = "NIXL #1413"


def check_ucx_transports(cfg: RunConfig) -> list[ConfigProblem]:
    """``UCX_TLS`` lets NIXL connect, and allows the transport the config expects."""
    t = cfg.transport
    out = Problems()
    if t.ucx_tls.strip() and lacks_connectable_am(t.ucx_tls):
        out.add(
            "transport.ucx_tls",
            t.ucx_tls,
            "names no transport that carries UCX active messages with peer-failure handling "
            f"({', '.join(sorted(AM_PEER_FAILURE_TRANSPORTS))}): NIXL's UCX endpoints cannot "
            f"connect nor send notifications (UCX: 'no active messages transport', {ISSUE_NO_AM})",
            f"add tcp (e.g. {t.ucx_tls},tcp), or an InfiniBand transport (rc), or ucx_tls ''",
        )
    selection = parse_tls(t.ucx_tls)
    expected = expand(t.expected_ucx_transports)
    if expected and not any(selection.allows(name) for name in expected):
        out.add(
            "transport.expected_ucx_transports",
            t.expected_ucx_transports,
            f"are all excluded by transport.ucx_tls={t.ucx_tls}: the KV could never move the "
            "way this transport config expects",
            "add one of them to ucx_tls, or pick the transport config that matches ucx_tls",
        )
    return out


def check_weights_fit(cfg: RunConfig) -> list[ConfigProblem]:
    """Weights per GPU + the KV of one max_model_len sequence (vLLM refuses to start without
    it) + a runtime reserve fit in gpu_memory_utilization x the GPU's memory."""
    c, s, m = cfg.cluster, cfg.server, cfg.model
    if c.gpus_per_node <= 0 or c.gpu_memory_gib <= 0 or not _plannable(cfg):
        return []
    if m.num_attention_heads <= 0 or m.num_kv_heads <= 0 or m.max_model_len <= 0:
        return []
    budget = c.gpu_memory_gib * s.gpu_memory_utilization
    out = Problems()
    seen: set[int] = set()
    topo = cfg.topology
    for role in ("prefill", "decode", "agg"):
        spec = getattr(topo, role)
        if spec.count < 1 or spec.tp in seen:
            continue
        need = gpu_need(m, spec.tp)
        if fits(need, c.gpu_memory_gib, s.gpu_memory_utilization):
            continue
        seen.add(spec.tp)
        fitting = [
            tp
            for tp in (2, 4, 8, 16)
            if tp > spec.tp
            and tp <= c.gpus_per_node
            and m.num_attention_heads % tp == 0
            and fits(gpu_need(m, tp), c.gpu_memory_gib, s.gpu_memory_utilization)
        ]
        shorter = max_model_len_that_fits(m, spec.tp, c.gpu_memory_gib, s.gpu_memory_utilization)
        fixes = []
        if fitting:
            example = " (e.g. topology=1p1d_tp4)" if fitting[0] == 4 else ""
            fixes.append(f"tp >= {fitting[0]}{example}")
        if shorter >= 1024:
            fixes.append(f"model.max_model_len <= {shorter}")
        fixes.append("a larger server.gpu_memory_utilization or GPU")
        out.add(
            f"topology.{role}.tp",
            spec.tp,
            f"leaves {m.name} no room: per GPU {need.weights_gib:.1f} GiB of weights + "
            f"{need.kv_gib:.1f} GiB of KV for one {m.max_model_len}-token sequence (vLLM "
            f"will not start without it) + {need.reserve_gib:.0f} GiB runtime = "
            f"{need.total_gib:.1f} GiB > server.gpu_memory_utilization "
            f"{s.gpu_memory_utilization} x cluster.gpu_memory_gib {c.gpu_memory_gib} = "
            f"{budget:.1f} GiB",
            ", or ".join(fixes),
        )
    return out


def check_model_reachable(
    cfg: RunConfig, environ: Mapping[str, str] | None = None
) -> list[ConfigProblem]:
    """The servers can load ``model.path`` (checked from here when it can be).

    A hub id with ``HF_HUB_OFFLINE=1`` must already be in the hub cache the servers read.
    The servers' environment is this process's (inherited by local tasks and, by default, by
    sbatch) overlaid with ``cluster.env`` and ``server.env``. The cache is checked from here
    when it can be: the home default (shared home directories) or an explicit cache directory
    this machine sees; an explicit one this machine does not see is left to the preflight.

    A directory on SLURM is checked when it sits on the filesystem of the run dir (which
    every node must share) and its parent is visible here; otherwise the preflight checks it
    on the nodes. With the local executor ``check_model`` checks it.
    """
    m = cfg.model
    if m.generate or not m.path or cfg.command is Command.transfer_bench:
        return []  # the transfer bench needs the model's shape only, never its weights
    if is_local_path(m.path):
        return _shared_model_dir(cfg)
    env = dict(os.environ if environ is None else environ)
    env.update(cfg.cluster.env)
    env.update(cfg.server.env)
    if not hub_offline(env):
        return []
    cache = hub_cache(env, env.get("HOME") or str(Path.home()))
    if cache.explicit and not cache.path.is_dir():
        return []
    if hub_snapshots(cache.path, m.path):
        return []
    where = "cluster.env/server.env/the environment" if cache.explicit else "no HF_HOME set"
    return [
        ConfigProblem(
            "model.path",
            m.path,
            f"is a hub id, HF_HUB_OFFLINE=1 forbids downloading it, and the hub cache the "
            f"servers read ({cache.path}, {cache.source}; {where}) does not hold "
            f"{hub_repo_dir(cache.path, m.path).name}: the servers cannot load it",
            "model.path=<a directory every node reads, e.g. /shared/models/"
            f"{m.path.split('/')[-1]}>, or cluster.env.HF_HOME=<a shared cache holding it> "
            "(download it where the internet is: huggingface-cli download "
            f"{m.path})",
        )
    ]


def _shared_model_dir(cfg: RunConfig) -> list[ConfigProblem]:
    """A SLURM model directory missing from the run dir's (shared) filesystem."""
    if cfg.cluster.executor is not ExecutorKind.slurm:
        return []
    model = Path(cfg.model.path).expanduser().absolute()
    if model.exists() or not model.parent.is_dir():
        return []
    run_dir = Path(cfg.dir).expanduser().absolute()
    anchor = next((p for p in (run_dir, *run_dir.parents) if p.exists()), None)
    try:
        shared = anchor is not None and anchor.stat().st_dev == model.parent.stat().st_dev
    except OSError:
        return []
    if not shared or anchor == Path(anchor.anchor):
        return []
    return [
        ConfigProblem(
            "model.path",
            cfg.model.path,
            f"does not exist, though {model.parent} is on the filesystem of the run dir "
            f"({anchor}) that every node shares: the servers cannot load it",
            f"the model's directory (ls {model.parent})",
        )
    ]


def _plannable(cfg: RunConfig) -> bool:
    """Counts and TP sizes sane enough to place instances (other rules report the rest)."""
    topo, c = cfg.topology, cfg.cluster
    specs = (topo.prefill, topo.decode, topo.agg)
    if any(s.count < 0 or s.tp < 1 for s in specs) or c.nodes < 1:
        return False
    too_wide = any(s.count > 0 and s.tp > c.gpus_per_node for s in specs)
    return not (c.gpus_per_node > 0 and too_wide)


GPU_RULES = (
    check_ucx_transports,
    *KV_PATH_RULES,
    check_weights_fit,
    check_model_reachable,
    check_containers,
    check_container_requeue,
)
