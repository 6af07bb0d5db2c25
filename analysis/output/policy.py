"""``policy.json`` built from an analysed run (pure, but ``write``).

Written beside ``summary.json`` by ``python -m analysis`` when a deployment's crossover was
measured. The file's types, fields and reader are ``pdbench.results.policy_file`` (one
schema for the analysis that writes it and the router, validation and ``analysis.whatif``
that read it); how a router applies it is ``pdbench.results.policy_rule``.
"""

from __future__ import annotations

from analysis.method.deployment import Context, DeploymentAnalysis, LoadAnalysis
from analysis.method.saving_curve import Shape
from analysis.method.spent_cost import SpentCosts
from pdbench.results.interval import Interval
from pdbench.results.policy_file import (
    FILE_NAME,
    SCHEMA_VERSION,
    DeploymentPolicy,
    Policy,
    PullCost,
    RecomputeRate,
    ThresholdBand,
    read,
    write,
)

__all__ = [
    "FILE_NAME",
    "SCHEMA_VERSION",
    "DeploymentPolicy",
    "Policy",
    "PullCost",
    "RecomputeRate",
    "ThresholdBand",
    "deployment_policy",
    "policy_of",
    "read",
    "topology_class",
    "write",
]


def pull_cost_of(s: SpentCosts | None) -> PullCost | None:
    """The pull cost a spent-cost fit found (None: no fit)."""
    if s is None or s.shape is Shape.NO_DATA:
        return None
    return PullCost(s.t0_ms, s.beta_ms_per_token)


def topology_class(placement: str, hosts: dict[str, str]) -> tuple[str, str]:
    """(same_node | cross_node, "nodes" | "placement"): the instances' hosts decide when P
    and D hosts are known (disjoint: cross_node; the same set: same_node), else the
    topology's placement."""

    def host(text: str) -> str:  # "node (address)" or "address:port" -> the node
        name = text.split(" (")[0]
        return name.rsplit(":", 1)[0] if ":" in name and " (" not in text else name

    def names(role: str) -> set[str]:
        return {host(h) for i, h in hosts.items() if i.startswith(role) and h}

    p, d = names("prefill"), names("decode")
    if p and d and not p & d:
        return "cross_node", "nodes"
    if p and d and p == d:
        return "same_node", "nodes"
    return placement or "unknown", "placement"


def _bands(loads: list[LoadAnalysis]) -> list[ThresholdBand]:
    out = []
    for i, load in enumerate(loads):
        c, t, m = load.concurrency, load.threshold_advice, load.measured.crossover
        nxt = loads[i + 1].concurrency if i + 1 < len(loads) else None
        lo = (1 if c is not None else None) if i == 0 else c
        pred = load.spent
        out.append(
            ThresholdBand(
                concurrency=c,
                min_concurrency=lo,
                max_concurrency=nxt - 1 if nxt is not None else None,
                kv_recompute_threshold=t.value,
                threshold_interval=Interval(t.value, t.low, t.high),
                crossover=Interval(m.estimate, m.low, m.high),
                shape=m.shape.value,
                status=m.status.value,
                predicted=pred.crossover if pred.shape is Shape.CROSSING else None,
                validated=load.check.validated,
                pull_cost=pull_cost_of(pred),
            )
        )
    return out


def deployment_policy(a: DeploymentAnalysis, tp_pair: str) -> DeploymentPolicy:
    """``tp_pair``: ``"1->2"`` (``load.point_row``'s)."""
    cls, source = topology_class(a.placement, a.hosts)
    p_tp, _, d_tp = tp_pair.partition("->")
    rates = [
        RecomputeRate(load.concurrency, load.spent.tokens_per_s, load.spent.recompute_ms_per_token2)
        for load in a.loads
        if load.spent.shape is not Shape.NO_DATA
    ]
    return DeploymentPolicy(
        deployment_id=a.deployment_id,
        label=a.label,
        model=a.model,
        transport=a.transport,
        tp_prefill=int(p_tp or 0) if p_tp.isdigit() else 0,
        tp_decode=int(d_tp or 0) if d_tp.isdigit() else 0,
        topology_class=cls,
        topology_source=source,
        block_size=a.block_size,
        pull_cost=pull_cost_of(a.pull_cost),
        recompute_rate=rates,
        thresholds=_bands(a.loads),
    )


def policy_of(ctx: Context) -> Policy | None:
    """The policy of every deployment whose crossover was measured (None: no such one)."""
    pts = ctx.data.points
    deps = []
    for a in ctx.deployments():
        if all(x.measured.crossover.shape is Shape.NO_DATA for x in a.loads):
            continue
        pair = str(pts.loc[pts["deployment_id"] == a.deployment_id, "tp_pair"].iloc[0])
        deps.append(deployment_policy(a, pair))
    if not deps:
        return None
    return Policy([str(d) for d in ctx.data.run_dirs], deps)
