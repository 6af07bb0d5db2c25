"""Pure planning: a composed RunConfig becomes Deployments x Points.

A Deployment is the set of servers that can stay up (model, topology, transport, server
flags, ``kv_recompute_threshold``); its Points (``pdbench.plan.points``) are the workloads
measured on it, in their run order. A Deployment's id hashes the measured settings of its
servers (``pdbench.results.identity``: operational knobs such as timeouts and ports stay out),
so a rerun finds what is done.

Placement: instances are laid out in a fixed order (prefill, decode, agg). ``same_node``
packs them onto node 0 while they fit (GPUs by TP, or CPU cores by TP x threads per rank)
and spills to the next node; ``cross_node`` puts prefill instances on the first nodes and
decode instances on the nodes after them. On CPU each TP rank gets its own cores; with
``server.cpu_share_cores`` and more ranks than cores, each instance gets a share of the
cores in proportion to its ranks and its ranks share those (``share_budgets``).
Ports: instance ``i`` (global order) listens on ``server.base_port + i`` and its NIXL side
channel on ``server.side_channel_base_port + 64 * i`` (vLLM 0.32's scheduler answers there
for every rank; the stride leaves room); vLLM's own ports (``VLLM_PORT``) start at
``server.vllm_base_port + 16 * i``, so that servers starting at once never race for one.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, replace
from typing import Any

from pdbench.config.schema import (
    ConnectorConfig,
    Flow,
    FlowConfig,
    ModelConfig,
    Placement,
    RunConfig,
    ServerConfig,
    TopologyConfig,
    TransportConfig,
)
from pdbench.plan.crossover_search import SearchPlan, search_plan
from pdbench.plan.lengths import usable_history
from pdbench.plan.points import Point, deployment_points
from pdbench.results.identity import measured, stable_hash
from pdbench.results.jsonable import to_jsonable
from pdbench.results.policy_file import PolicyTarget

SIDE_CHANNEL_STRIDE = 64
VLLM_PORT_STRIDE = 16  # ports of one instance's VLLM_PORT range (vLLM scans up from there)
# flows that apply a rule of flow.policy's file per turn
POLICY_FLOWS = (Flow.policy, Flow.static_light, Flow.static_heavy)
PD_FLOWS = (Flow.recompute, Flow.pull, Flow.decode_first, *POLICY_FLOWS)
# flows that hand P the KV D kept: D must keep it (bidirectional_kv_xfer)
KEEPS_D_KV = (Flow.pull, Flow.decode_first, *POLICY_FLOWS)


def policy_target(
    model: ModelConfig, topology: TopologyConfig, transport: TransportConfig, server: ServerConfig
) -> PolicyTarget:
    """What a policy.json entry must match to apply to these servers
    (``pdbench.results.policy_file.entry_for``); the topology class from the placement."""
    return PolicyTarget(
        model=str(model.name),
        transport=str(transport.name),
        tp_prefill=topology.prefill.tp,
        tp_decode=topology.decode.tp,
        topology_class=topology.placement.value,
        block_size=server.block_size,
    )


@dataclass(frozen=True)
class Instance:
    """One vLLM server of a deployment."""

    name: str  # prefill0, decode0, agg0
    role: str  # prefill | decode | mixed
    index: int  # global order within the deployment
    node: int  # plan node index == task rank
    tp: int
    gpus: tuple[int, ...]  # device indices on its node; () on CPU
    cpus: tuple[int, ...]  # cores it is pinned to (CPU builds), rank 0's first
    http_port: int
    side_channel_port: int
    vllm_port: int = 0  # VLLM_PORT: where vLLM's own ports start; 0: unset (vLLM picks)

    def rank_cpus(self) -> list[tuple[int, ...]]:
        """The cores of each TP rank: ``cpus`` cut into ``tp`` equal slices, in rank order."""
        if not self.cpus:
            return []
        per_rank = max(1, len(self.cpus) // self.tp)
        return [self.cpus[r * per_rank : (r + 1) * per_rank] for r in range(self.tp)]


@dataclass
class Deployment:
    """Servers that can stay up for several Points, with the typed configs that make them.

    ``flow`` carries the connector and router knobs (``cache_hit_threshold``,
    ``decode_first_fallback``, ...) with this Deployment's one value of each deployment axis;
    ``kv_recompute_threshold`` and ``decoder_kv_blocks_ttl_s`` are those values.
    """

    deployment_id: str
    nodes: int
    instances: list[Instance]
    kv_recompute_threshold: int
    decoder_kv_blocks_ttl_s: int
    bidirectional: bool
    model: ModelConfig
    topology: TopologyConfig
    transport: TransportConfig
    server: ServerConfig
    flow: FlowConfig
    connector: ConnectorConfig

    def key(self) -> dict[str, Any]:
        """What the id hashes: servers that differ in any of these cannot be shared; their
        operational knobs (``pdbench.results.identity.OPERATIONAL``) are left out."""
        return {
            "model": measured("model", to_jsonable(self.model)),
            "topology": measured("topology", to_jsonable(self.topology)),
            "transport": measured("transport", to_jsonable(self.transport)),
            "server": measured("server", to_jsonable(self.server)),
            "kv_recompute_threshold": self.kv_recompute_threshold,
            "decoder_kv_blocks_ttl_s": self.decoder_kv_blocks_ttl_s,
            "kv_tail": self.flow.kv_tail,
            "bidirectional": self.bidirectional,
            "trace": self.connector.trace,
        }

    def record(self) -> dict[str, Any]:
        """The Deployment as each PointResult keeps it (JSON)."""
        return {
            "deployment_id": self.deployment_id,
            "model": to_jsonable(self.model),
            "topology": to_jsonable(self.topology),
            "transport": to_jsonable(self.transport),
            "server": to_jsonable(self.server),
            "kv_recompute_threshold": self.kv_recompute_threshold,
            "decoder_kv_blocks_ttl_s": self.decoder_kv_blocks_ttl_s,
            "kv_tail": self.flow.kv_tail,
            "bidirectional": self.bidirectional,
            "trace": self.connector.trace,
            "instances": [to_jsonable(i) for i in self.instances],
        }

    def by_role(self, role: str) -> list[Instance]:
        return [i for i in self.instances if i.role == role]

    def policy_target(self) -> PolicyTarget:
        return policy_target(self.model, self.topology, self.transport, self.server)

    @property
    def agg_instance(self) -> Instance:
        """Where ``agg`` runs: a mixed instance, else the first decode instance."""
        mixed = self.by_role("mixed")
        return mixed[0] if mixed else self.by_role("decode")[0]


@dataclass
class Plan:
    deployments: list[Deployment]
    points: dict[str, list[Point]] = field(default_factory=dict)  # deployment id -> points
    # deployment id -> its crossover search (no history lengths given): ``points`` then
    # holds the first pass, the job chooses the rest as it goes
    searches: dict[str, SearchPlan] = field(default_factory=dict)

    def all_points(self) -> list[Point]:
        return [p for d in self.deployments for p in self.points[d.deployment_id]]


def _node_capacity(cfg: RunConfig) -> tuple[str, int]:
    """What instances are packed by on one node: ("gpu", n) or ("cpu", cores)."""
    if cfg.cluster.gpus_per_node > 0:
        return "gpu", cfg.cluster.gpus_per_node
    cores = cfg.cluster.cpus_per_node or os.cpu_count() or 1
    return "cpu", cores


def _role_order(cfg: RunConfig) -> list[tuple[str, str, int]]:
    """(name, role, tp) for every instance, in placement order."""
    topo = cfg.topology
    out = [(f"prefill{i}", "prefill", topo.prefill.tp) for i in range(topo.prefill.count)]
    out += [(f"decode{i}", "decode", topo.decode.tp) for i in range(topo.decode.count)]
    out += [(f"agg{i}", "mixed", topo.agg.tp) for i in range(topo.agg.count)]
    return out


def cpu_cores(cursor: int, tp: int, threads: int, capacity: int, budget: int) -> tuple[int, ...]:
    """The cores of one CPU instance, rank by rank (``threads`` each), from ``cursor`` on.

    Cores are counted across the whole plan (plan nodes sharing one host, as with the local
    executor or the local SLURM test cluster, never pin two servers to one core). With a
    ``budget`` of fewer cores than its ranks need (``share_budgets``), the instance's ranks
    share its own cores rather than another instance's: TP ranks of one server wait for
    each other at every layer anyway, another server would not.
    """
    need = tp * threads
    if budget >= need:
        return tuple((cursor + k) % capacity for k in range(need))
    pool = [(cursor + k) % capacity for k in range(budget)]
    return tuple(pool[(r * threads + k) % budget] for r in range(tp) for k in range(threads))


def share_budgets(needs: list[int], threads: int, capacity: int) -> list[int]:
    """Cores per instance when ranks share cores (``server.cpu_share_cores``): all they need
    when the plan fits, else a share of the cores in proportion to their ranks (at least one
    rank's ``threads``)."""
    total = sum(needs)
    if total <= capacity:
        return list(needs)
    return [min(n, max(threads, capacity * n // total)) for n in needs]


def place_instances(cfg: RunConfig) -> tuple[list[Instance], int]:
    """Lay instances onto nodes; returns the instances and the number of nodes used."""
    kind, capacity = _node_capacity(cfg)
    threads = cfg.server.cpu_threads_per_instance
    share = kind == "cpu" and cfg.server.cpu_share_cores
    instances: list[Instance] = []
    node, used = 0, 0
    cross = cfg.topology.placement is Placement.cross_node
    previous_role = None
    core_cursor = 0
    order = _role_order(cfg)
    needs = [tp * threads for _, _, tp in order]
    budgets = share_budgets(needs, threads, capacity) if share else needs
    for index, (name, role, tp) in enumerate(order):
        need = tp if kind == "gpu" else tp * threads
        role_changed = previous_role is not None and role != previous_role
        full = used and used + need > capacity and not share
        if (cross and role_changed and role == "decode") or full:
            node, used = node + 1, 0
        gpus = tuple(range(used, used + tp)) if kind == "gpu" else ()
        budget = budgets[index]
        cpus = cpu_cores(core_cursor, tp, threads, capacity, budget) if kind == "cpu" else ()
        core_cursor += budget
        used += need
        instances.append(
            Instance(
                name=name,
                role=role,
                index=index,
                node=node,
                tp=tp,
                gpus=gpus,
                cpus=cpus,
                http_port=cfg.server.base_port + index,
                side_channel_port=cfg.server.side_channel_base_port + SIDE_CHANNEL_STRIDE * index,
                vllm_port=cfg.server.vllm_base_port + VLLM_PORT_STRIDE * index,
            )
        )
        previous_role = role
    return instances, node + 1


def deployment_axes(flow: FlowConfig) -> list[tuple[int, int, str]]:
    """(kv_recompute_threshold, TTL, name suffix) per Deployment: the product of the
    deployment axes' values (the TTL named when it has several)."""
    ttls = flow.decoder_kv_blocks_ttl_s
    return [
        (threshold, ttl, f"t{threshold}" + (f"-ttl{ttl}" if len(ttls) > 1 else ""))
        for threshold in flow.kv_recompute_threshold
        for ttl in ttls
    ]


def make_plan(cfg: RunConfig) -> Plan:
    """Deployments (one per ``kv_recompute_threshold`` x TTL) x Points (flow x history
    length x conversations x concurrency x repetition), each Deployment's Points in its run
    order."""
    cfg = copy.deepcopy(cfg)  # the plan owns its configs: later edits of cfg do not leak in
    flows = list(dict.fromkeys(cfg.flow.flows))
    plan = Plan(deployments=make_deployments(cfg, flows))
    workload, search = cfg.workload, None
    if not workload.history_tokens:  # no lengths given: search for the crossover
        loads = workload.concurrency
        search = search_plan(
            cfg.search, usable_history(cfg.model, workload), loads, len(flows), workload, flows
        )
        workload = replace(workload, history_tokens=list(search.first_lengths))
    for dep in plan.deployments:
        plan.points[dep.deployment_id] = deployment_points(
            dep.deployment_id, dep.flow, flows, workload
        )
        if search is not None:
            plan.searches[dep.deployment_id] = search
    return plan


def make_deployments(cfg: RunConfig, flows: list[Flow]) -> list[Deployment]:
    """One Deployment per ``kv_recompute_threshold`` x TTL (``deployment_axes``), its
    instances placed (``place_instances``) and its id hashed from its ``key``."""
    bidirectional = any(f in KEEPS_D_KV for f in flows)
    instances, nodes = place_instances(cfg)
    deployments = []
    for threshold, ttl, suffix in deployment_axes(cfg.flow):
        name = f"{cfg.model.name}-{cfg.topology.name}-{cfg.transport.name}-{suffix}"
        dep = Deployment(
            deployment_id="",
            nodes=nodes,
            instances=list(instances),
            kv_recompute_threshold=threshold,
            decoder_kv_blocks_ttl_s=ttl,
            bidirectional=bidirectional,
            model=cfg.model,
            topology=cfg.topology,
            transport=cfg.transport,
            server=cfg.server,
            flow=replace(
                cfg.flow, kv_recompute_threshold=[threshold], decoder_kv_blocks_ttl_s=[ttl]
            ),
            connector=cfg.connector,
        )
        dep.deployment_id = f"{name}-{stable_hash(dep.key(), 8)}"
        deployments.append(dep)
    return deployments
