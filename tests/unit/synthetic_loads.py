"""A synthetic deployment measured at several loads (concurrencies), for unit tests.

Each load is ``testbed.synthetic``'s run of one ``SyntheticDeployment`` whose costs are
those at that load (P recomputes slower under load); its Points carry the load's
concurrency in their workload and in their id, as a swept ``workload.concurrency`` does.
"""

from __future__ import annotations

from dataclasses import replace

from analysis.load.runs import RunData, records_to_run_data
from testbed.synthetic import Noise, SyntheticDeployment, synthetic_records


def at_load(dep: SyntheticDeployment, slowdown: float) -> SyntheticDeployment:
    """The deployment's costs with P's prefill ``slowdown`` x slower (queueing under load)."""
    return replace(dep, c1_s=dep.c1_s * slowdown, c2_s=dep.c2_s * slowdown)


def load_records(
    loads: dict[int, SyntheticDeployment],
    histories: tuple[int, ...],
    repetitions: int = 4,
    noise: float | Noise = 0.0,
    seed: int = 0,
    conversations: int = 2,
    turns: int = 2,
    edit=None,
) -> list[tuple[dict, list[dict]]]:
    """(PointResult dict, request dicts) of every load; ``edit(point, requests)`` may change
    a Point's records in place (a split that lies, a host)."""
    items = []
    for conc, dep in sorted(loads.items()):
        s = synthetic_records(
            [dep],
            histories,
            turns=turns,
            conversations=conversations,
            flows=("recompute", "pull"),
            noise=noise,
            seed=seed * 101 + conc,  # a load measures the same alone or swept
            repetitions=repetitions,
            traces=False,
        )
        for point, reqs in s.points:
            point = {**point, "point_id": f"{point['point_id']}-c{conc}"}
            point["workload"] = {**point["workload"], "concurrency": conc}
            if edit is not None:
                edit(point, reqs)
            items.append((point, reqs))
    return items


def load_run(loads: dict[int, SyntheticDeployment], histories: tuple[int, ...], **kw) -> RunData:
    return records_to_run_data(load_records(loads, histories, **kw))
