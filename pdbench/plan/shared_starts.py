"""Which jobs of a ``-m`` sweep measure on servers an earlier job of the sweep starts (pure).

A sweep over workloads (``-m +experiment=flows workload=a,b,c``, or ``workload.api=
completions,chat``) composes one job per value, each planning the same Deployments. Run
one after another on this machine, each job used to start those servers again. Instead,
the first job of a group measures the Points of the later ones on its servers too; when
their turn comes their Points are recorded ok and they start nothing (a Point the first job
could not measure is measured by its own job, as on any resume).

Jobs share only when they could not tell the difference: a run (not a search) on the
local executor, into the same run dir, with configs equal but for
``workload`` and with the same ``workload.request_timeout_s`` (the router's timeout, in the
launch spec); then a Deployment of the same id has the same launch spec but for the Points
it runs (``tests/unit/test_shared_starts.py`` holds the two to that). SLURM sweeps keep a
job per composition: their jobs run side by side. Each Point's record (and W&B run config)
carries its own workload; the shared job's W&B config is otherwise the first job's. A dry
run of the sweep shares as its run would: the first job prints the Points of the later ones
with its servers, the later ones print which job runs theirs (``dry_run_line``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pdbench.config.schema import Command, ExecutorKind, RunConfig
from pdbench.plan.deployments import Plan, make_plan
from pdbench.plan.identity import differences, stable_hash
from pdbench.results.jsonable import to_jsonable


def sharing_key(cfg: RunConfig) -> str | None:
    """Jobs with equal keys may share their servers; None: this job never does. ``cfg.dir``
    as the CLI resolved it (an absolute path: two spellings of one dir are equal)."""
    if (
        cfg.command is not Command.run
        or cfg.cluster.executor is not ExecutorKind.local
        or not cfg.workload.history_tokens  # a crossover search chooses its Points as it goes
    ):
        return None
    config = to_jsonable(cfg)
    config["workload"] = {"request_timeout_s": cfg.workload.request_timeout_s}
    return stable_hash(config, 16)


def later_jobs(cfgs: list[RunConfig]) -> list[list[int]]:
    """For each job of a sweep, in order, the later jobs whose Points it measures too: the
    first job of each group of equal ``sharing_key`` takes the group's later ones."""
    first: dict[str, int] = {}
    out: list[list[int]] = [[] for _ in cfgs]
    for i, cfg in enumerate(cfgs):
        key = sharing_key(cfg)
        if key is None:
            continue
        if key in first:
            out[first[key]].append(i)
        else:
            first[key] = i
    return out


def dry_run_line(index: int, later: list[list[int]]) -> str | None:
    """What the dry run of the sweep's job ``index`` (0-based) prints instead of its plan
    when an earlier job measures its Points (``later_jobs``' lists); None: its own plan."""
    first = next((i for i, taken in enumerate(later) if index in taken), None)
    if first is None:
        return None
    return (
        f"sweep job {index + 1}: its Points run on the servers of sweep job {first + 1} "
        "(printed above), as they will in the run"
    )


def with_points_of(plan: Plan, other: Plan) -> Plan:
    """``plan`` whose Deployments also measure the Points ``other`` plans on a Deployment
    of the same id (after their own, each Point once)."""
    points = dict(plan.points)
    for dep_id in points.keys() & other.points.keys():
        have = {p.point_id for p in points[dep_id]}
        after = 1 + max((p.order_index for p in points[dep_id]), default=-1)
        points[dep_id] = [
            *points[dep_id],
            *(
                replace(p, order_index=after + p.order_index)  # the run order: after them
                for p in other.points[dep_id]
                if p.point_id not in have
            ),
        ]
    return replace(plan, points=points)


def share_servers(plan: Plan, cfg: RunConfig, later: Sequence[RunConfig]) -> tuple[Plan, list[str]]:
    """``plan`` (of ``cfg``) with the Points of the ``later`` jobs that plan its Deployments,
    and a line for each such job."""
    lines = []
    for other_cfg in later:
        merged = with_points_of(plan, make_plan(other_cfg))
        added = sum(len(merged.points[d]) - len(plan.points[d]) for d in plan.points)
        if added:
            plan = merged
            lines.append(
                f"sweep: the {added} Point(s) of its job with "
                f"{workload_difference(cfg, other_cfg)} run on these servers too"
            )
    return plan, lines


def workload_difference(cfg: RunConfig, other: RunConfig) -> str:
    """The workload settings ``other`` gives another value, as overrides."""
    changed = differences(to_jsonable(cfg.workload), to_jsonable(other.workload))
    shown = ", ".join(f"workload.{key}={value}" for key, _, value in changed[:4])
    more = f" (+{len(changed) - 4} more)" if len(changed) > 4 else ""
    return shown + more or "the same workload"
