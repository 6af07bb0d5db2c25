"""Which UCX transport would carry the KV between P and D where the plan puts them (pure).

UCX picks the fastest transport that reaches a peer: between two processes of one node that
is CUDA IPC for GPU memory (NVLink) or shared memory for host memory, whatever network
transport ``UCX_TLS`` also allows; across nodes only a network transport (rc, dc, tcp)
reaches at all. A transport config names what it measures (``expected_ucx_transports``), so
two placements cannot measure it:

- an intra-node transport (``nvlink``: cuda_ipc) with a P and a D on different nodes: UCX
  falls back to a network path or fails (``check_kv_stays_on_node``);
- an inter-node transport (``rdma``: rc) with a P and a D on one node, while ``UCX_TLS``
  still allows the node's own path (cuda_ipc in rdma's ``rc,cuda_copy,cuda_ipc``): UCX moves
  the KV over NVLink and every Point and the answer would say "rdma"
  (``check_kv_crosses_nodes``).

A conversation's turn may go to any P and any D (the router hashes the conversation onto
each list), so every (P node, D node) pair of the plan counts.
"""

from __future__ import annotations

from connector.ucx import expand, parse_tls
from pdbench.config.problems import ConfigProblem
from pdbench.config.schema import Command, RunConfig
from pdbench.plan.deployments import place_instances

# Transports that only reach processes of the same host.
INTRA_NODE_TRANSPORTS = frozenset({"cuda_ipc", "posix", "sysv", "xpmem", "cma", "knem", "self"})
# The cross-node topology of the same instances (conf/topology/).
CROSS_NODE_TWINS = {"1p1d": "1p1d_cross", "1p1d_tp1": "1p1d_cross", "1p1d_tp4": "1p1d_tp4_cross"}
# What UCX prefers between two processes of one node, per KV memory kind.
SAME_NODE_PATHS = {
    "cuda": ("cuda_ipc",),
    "cpu": ("cma", "xpmem", "knem", "posix", "sysv"),
}


def kv_node_pairs(cfg: RunConfig) -> set[tuple[int, int]]:
    """(P node, D node) of every prefill and decode instance the KV may move between."""
    instances, _ = place_instances(cfg)
    p_nodes = {i.node for i in instances if i.role == "prefill"}
    d_nodes = {i.node for i in instances if i.role == "decode"}
    return {(p, d) for p in p_nodes for d in d_nodes}


def same_node_path(kv_buffer_device: str, ucx_tls: str) -> str:
    """The transport UCX would move KV in ``kv_buffer_device`` memory over between two
    processes of one node, when ``ucx_tls`` allows one; "" when it allows none."""
    memory = "cuda" if kv_buffer_device.startswith("cuda") else "cpu"
    selection = parse_tls(ucx_tls)
    return next((t for t in SAME_NODE_PATHS[memory] if selection.allows(t)), "")


def _applies(cfg: RunConfig) -> bool:
    """A run (or its preflight) of a P/D topology the plan can place: the transfer bench
    places its own two tasks, and other rules report counts it cannot place."""
    topo, c = cfg.topology, cfg.cluster
    if cfg.command is Command.transfer_bench or topo.prefill.count < 1 or topo.decode.count < 1:
        return False
    specs = (topo.prefill, topo.decode, topo.agg)
    if any(s.count < 0 or s.tp < 1 for s in specs) or c.nodes < 1:
        return False
    too_wide = any(s.count > 0 and s.tp > c.gpus_per_node for s in specs)
    return not (c.gpus_per_node > 0 and too_wide)


def _pairs_text(pairs: set[tuple[int, int]]) -> str:
    return ", ".join(f"P node {p} -> D node {d}" for p, d in sorted(pairs))


def check_kv_stays_on_node(cfg: RunConfig) -> list[ConfigProblem]:
    """A transport that only moves KV inside a node (NVLink/CUDA IPC, shared memory) needs
    every prefill instance on the node of every decode instance."""
    expected = expand(cfg.transport.expected_ucx_transports)
    if not expected or not expected <= INTRA_NODE_TRANSPORTS or not _applies(cfg):
        return []
    pairs = kv_node_pairs(cfg)
    if all(p == d for p, d in pairs):
        return []
    p_nodes = sorted({p for p, _ in pairs})
    d_nodes = sorted({d for _, d in pairs})
    t, topo = cfg.transport, cfg.topology
    return [
        ConfigProblem(
            "transport",
            t.name,
            f"moves KV only inside a node ({', '.join(sorted(expected))}) but topology "
            f"'{topo.name}' ({topo.placement.name}) puts prefill on node(s) {p_nodes} and "
            f"decode on node(s) {d_nodes}: UCX would fall back to a slower path or fail",
            "transport=rdma (or tcp) for KV across nodes, or a same_node topology that fits "
            f"one node's {cfg.cluster.gpus_per_node} GPUs",
        )
    ]


def check_kv_crosses_nodes(cfg: RunConfig) -> list[ConfigProblem]:
    """A transport that names only inter-node transports (rc, tcp...) cannot be what moves
    the KV between a P and a D of one node while ``UCX_TLS`` allows the node's own path:
    UCX takes that path, and the run would report the named fabric for it."""
    t = cfg.transport
    expected = expand(t.expected_ucx_transports)
    if not expected or expected & INTRA_NODE_TRANSPORTS or not _applies(cfg):
        return []
    local = {(p, d) for p, d in kv_node_pairs(cfg) if p == d}
    path = same_node_path(t.kv_buffer_device, t.ucx_tls)
    if not local or not path:
        return []
    topo = cfg.topology
    tls = f"transport.ucx_tls={t.ucx_tls}" if t.ucx_tls else "transport.ucx_tls '' (any)"
    twin = CROSS_NODE_TWINS.get(topo.name)
    cross = f"topology={twin}" if twin else "topology.placement=cross_node"
    nodes = "" if cfg.cluster.nodes >= 2 else " and cluster.nodes=2"
    same_node = "nvlink" if path == "cuda_ipc" else "dram"
    return [
        ConfigProblem(
            "transport",
            t.name,
            f"names a fabric between nodes ({', '.join(sorted(expected))}) but topology "
            f"'{topo.name}' ({topo.placement.name}) puts P and D on one node "
            f"({_pairs_text(local)}), where {tls} lets UCX move the KV over {path}: every "
            f"Point would measure {path}, and the answer would call it {t.name}",
            f"{cross}{nodes} to measure {t.name} between nodes, or transport={same_node} "
            "to measure the node's own path",
        )
    ]


KV_PATH_RULES = (check_kv_stays_on_node, check_kv_crosses_nodes)
"""The rules that tie a transport to the placement it can measure."""
