"""A command line's sweep, planned once (pure): compositions -> launches -> Deployments x Points.

One model, as vLLM's ``bench sweep`` has it: deployment axes (each value its own servers) x
Point axes (the servers stay up, each value its own Points). A composition's axes are list
fields (``pdbench.config.axes``) that ``pdbench.plan.deployments.make_plan`` expands. A
``-m`` sweep composes one config per combination of its values; here they become launches:

1. **Folded.** Compositions that differ only in axis values are one composition whose axes
   hold the values of all (``-m workload.concurrency=1,4`` is ``workload.concurrency=[1,4]``:
   a crossover search then searches both loads together).
2. **Sharing servers.** Runs (not searches) that differ only in what their Points measure
   (workload settings: ``-m workload=a,b``, ``workload.api=completions,chat``) are one launch:
   a Deployment two of them plan (the same id: the same servers) starts once and measures
   the Points of both, in their order (the first's Points first). Local and SLURM alike.
3. Anything else (another model, transport, cluster setting...) is a launch of its own; the
   launches of one command line share its run dir.

Each Point's record carries its own workload; the run dir's manifest keeps every member
composition's config (``pdbench.driver.run_dir``). ``table`` is the dry run's view of it all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pdbench.config.axes import axes_of
from pdbench.config.schema import Command, RunConfig
from pdbench.plan.deployments import Plan, make_plan
from pdbench.results.identity import stable_hash
from pdbench.results.jsonable import to_jsonable

AXES = axes_of(RunConfig)


@dataclass
class Composition:
    """A config to launch: one composition of the command line, or several folded into one
    (``members``: their indices, in order)."""

    cfg: RunConfig
    members: list[int]


@dataclass
class Launch:
    """One launch of a sweep: compositions measured on the Deployments of one plan (``plan``
    None: a command that plans none, such as ``status``)."""

    cfg: RunConfig  # the first composition's: where and how it runs
    compositions: list[Composition]
    plan: Plan | None

    @property
    def members(self) -> list[int]:
        return [i for c in self.compositions for i in c.members]


def _without(config: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``config`` (JSON) without the dotted ``keys``."""
    out = to_jsonable(config)
    for key in keys:
        section, _, leaf = key.rpartition(".")
        node = out
        for part in section.split(".") if section else []:
            node = node.get(part, {})
        node.pop(leaf, None)
    return out


def fold_key(cfg: RunConfig) -> str | None:
    """Compositions with equal keys differ only in axis values; None: never folded."""
    if cfg.command is not Command.run:
        return None
    return stable_hash(_without(to_jsonable(cfg), list(AXES)), 16)


def share_key(cfg: RunConfig) -> str | None:
    """Compositions with equal keys may measure on one launch's servers: equal but for their
    workloads (the router's timeout, in the launch spec, apart) and axis values. None: never
    (not a run, or a crossover search, which chooses its Points as it goes)."""
    if cfg.command is not Command.run or not cfg.workload.history_tokens:
        return None
    config = _without(to_jsonable(cfg), list(AXES))
    config["workload"] = {"request_timeout_s": cfg.workload.request_timeout_s}
    return stable_hash(config, 16)


def _union(lists: list[list[Any]]) -> list[Any]:
    return list(dict.fromkeys(v for values in lists for v in values))


def folded(cfgs: list[RunConfig]) -> RunConfig:
    """The composition measuring every axis value of ``cfgs`` (equal ``fold_key``s)."""
    first = cfgs[0]
    flow = replace(
        first.flow,
        flows=_union([c.flow.flows for c in cfgs]),
        kv_recompute_threshold=_union([c.flow.kv_recompute_threshold for c in cfgs]),
        decoder_kv_blocks_ttl_s=_union([c.flow.decoder_kv_blocks_ttl_s for c in cfgs]),
    )
    workload = replace(
        first.workload,
        history_tokens=_union([c.workload.history_tokens for c in cfgs]),
        conversations=_union([c.workload.conversations for c in cfgs]),
        concurrency=_union([c.workload.concurrency for c in cfgs]),
    )
    return replace(first, flow=flow, workload=workload)


def fold(cfgs: list[RunConfig]) -> list[Composition]:
    """The command line's compositions with those differing only in axis values folded
    (``folded``), in the order of their first member."""
    groups: dict[str, list[int]] = {}
    out: list[Composition] = []
    for i, cfg in enumerate(cfgs):
        key = fold_key(cfg)
        if key is None:
            out.append(Composition(cfg, [i]))
        elif key in groups:
            groups[key].append(i)
        else:
            groups[key] = [i]
            out.append(Composition(cfg, groups[key]))
    return [
        Composition(folded([cfgs[i] for i in c.members]), c.members) if len(c.members) > 1 else c
        for c in out
    ]


def merged(plan: Plan, other: Plan) -> Plan:
    """``plan`` with ``other``'s Deployments it lacks, and on each Deployment both share
    (one id) the Points of ``other`` it lacks, after its own in the run order."""
    points = {dep_id: list(ps) for dep_id, ps in plan.points.items()}
    deployments = list(plan.deployments)
    for dep in other.deployments:
        dep_id = dep.deployment_id
        if dep_id not in points:
            deployments.append(dep)
            points[dep_id] = list(other.points[dep_id])
            continue
        have = {p.point_id for p in points[dep_id]}
        after = 1 + max((p.order_index for p in points[dep_id]), default=-1)
        points[dep_id] += [
            replace(p, order_index=after + p.order_index)
            for p in other.points[dep_id]
            if p.point_id not in have
        ]
    return replace(plan, deployments=deployments, points=points)


def plan_sweep(compositions: list[Composition]) -> list[Launch]:
    """The launches of a command line's (folded) compositions, each with its plan."""
    launches: list[Launch] = []
    by_key: dict[str, Launch] = {}
    for comp in compositions:
        if comp.cfg.command is not Command.run:
            launches.append(Launch(comp.cfg, [comp], None))
            continue
        key, plan = share_key(comp.cfg), make_plan(comp.cfg)
        if key is not None and key in by_key:
            shared = by_key[key]
            shared.compositions.append(comp)
            shared.plan = merged(shared.plan, plan) if shared.plan else plan
            continue
        launch = Launch(comp.cfg, [comp], plan)
        launches.append(launch)
        if key is not None:
            by_key[key] = launch
    return launches


def _values(values: list[Any]) -> str:
    return ",".join(str(getattr(v, "value", v)) for v in values)


def common_overrides(overrides: list[list[str]]) -> list[str]:
    """The overrides every composition of the command line has (in the first's order)."""
    common = set.intersection(*(set(o) for o in overrides)) if overrides else set()
    return [o for o in overrides[0] if o in common] if overrides else []


def launch_line(number: int, launch: Launch, overrides: list[list[str]]) -> str:
    """Launch ``number`` (1-based) and the compositions it measures, each by the overrides
    that set it apart from the others."""
    common = set(common_overrides(overrides))
    members = [
        " ".join(o for o in overrides[i] if o not in common) or "(the rest)" for i in launch.members
    ]
    return (
        f"launch {number} measures {len(members)} composition(s) on one start of its "
        f"servers: {'; '.join(members)}"
    )


def table(launches: list[Launch], overrides: list[list[str]]) -> str:
    """The whole sweep as one table: each launch's compositions (by their overrides), each of
    its Deployments with its deployment axes, and its Points by their axes."""
    run = [launch for launch in launches if launch.plan is not None]
    deployments = sum(len(launch.plan.deployments) for launch in run if launch.plan)
    points = sum(len(launch.plan.all_points()) for launch in run if launch.plan)
    head = (
        f"sweep: {len(overrides)} composition(s) -> {len(run)} launch(es), "
        f"{deployments} Deployment(s), {points} Point(s)"
    )
    common = common_overrides(overrides)
    if common:
        head += f"; every composition: {' '.join(common)}"
    lines = [head]
    for number, launch in enumerate(run, 1):
        plan = launch.plan
        assert plan is not None
        lines.append(f"  {launch_line(number, launch, overrides)}")
        for dep in plan.deployments:
            pts = plan.points[dep.deployment_id]
            axes = {
                "flows": _values(list(dict.fromkeys(p.flow for p in pts))),
                "history": _values(sorted({p.history_tokens for p in pts})),
                "conversations": _values(sorted({p.workload.conversations[0] for p in pts})),
                "concurrency": _values(sorted({p.workload.concurrency[0] for p in pts})),
            }
            search = " + search" if dep.deployment_id in plan.searches else ""
            lines.append(
                f"    {dep.deployment_id}  threshold {dep.kv_recompute_threshold}, "
                f"ttl {dep.decoder_kv_blocks_ttl_s} s: {len(pts)} Point(s){search} "
                + " ".join(f"{k}={v}" for k, v in axes.items())
            )
    return "\n".join(lines) + "\n"
