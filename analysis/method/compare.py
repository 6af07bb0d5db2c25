"""What the questions across deployments compare (pure): families of deployments that
differ by one setting only, and which turns pulled.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pandas as pd

from analysis.load.runs import RunData


def pulled_share(turns: pd.DataFrame) -> dict[str, float]:
    """Point id -> share of its requests of turns >= 2 whose turn pulled KV from D
    (``by_turn[].tokens_pulled`` > 0): 0 where every later turn recomputed."""
    if not len(turns) or "tokens_pulled" not in turns:
        return {}
    t = turns[(turns["turn"] >= 2) & (turns["requests"] > 0)]
    pulled = (t["tokens_pulled"] > 0) * t["requests"]
    sums = pd.DataFrame({"p": pulled, "n": t["requests"], "id": t["point_id"]}).groupby("id")
    totals = sums.sum()
    return (totals["p"] / totals["n"]).to_dict()


def _drop(d: dict[str, Any], dotted: str) -> None:
    *path, last = dotted.split(".")
    for key in path:
        d = d.get(key) if isinstance(d.get(key), dict) else {}
    d.pop(last, None)


IGNORED = ("deployment_id", "instances")  # the id, and ports/nodes/CPUs that follow from the rest


def family_key(deployment: dict[str, Any], axes: tuple[str, ...]) -> str:
    """The deployment's settings without ``axes`` (dotted, e.g. ``topology.placement``),
    its id and its instance list."""
    d = copy.deepcopy(deployment or {})
    for key in (*IGNORED, *axes):
        _drop(d, key)
    return json.dumps(d, sort_keys=True, default=str)


def families(data: RunData, axes: tuple[str, ...]) -> list[list[str]]:
    """Groups (of two or more) of deployment ids with ok Points that differ only by ``axes``."""
    ok = data.ok_points
    if not len(ok):
        return []
    groups: dict[str, list[str]] = {}
    for dep_id in sorted(ok["deployment_id"].unique()):
        key = family_key(data.deployments.get(dep_id, {}), axes)
        groups.setdefault(key, []).append(dep_id)
    return [ids for ids in groups.values() if len(ids) > 1]


def _flat(d: Any, prefix: str = "") -> dict[str, str]:
    if not isinstance(d, dict):
        return {prefix.rstrip("."): json.dumps(d, sort_keys=True, default=str)}
    out: dict[str, str] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


def unmatched(data: RunData, column: str, axes: tuple[str, ...], answered: bool) -> str | None:
    """Why a swept ``column`` (a ``points`` column) was not compared: None when it was
    (``answered``) or when the ok Points hold one value of it; else the settings that differ
    besides ``axes`` between the deployments."""
    ok = data.ok_points
    if answered or not len(ok) or ok[column].dropna().astype(str).nunique() < 2:
        return None
    flats = [_flat(data.deployments.get(d, {})) for d in sorted(ok["deployment_id"].unique())]
    keys = sorted({k for f in flats for k in f})
    skip = (*IGNORED, *axes)
    differ = [
        k
        for k in keys
        if len({f.get(k) for f in flats}) > 1
        and not any(k == a or k.startswith(a + ".") for a in skip)
    ]
    shown = ", ".join(differ[:6]) + (f" (+{len(differ) - 6} more)" if len(differ) > 6 else "")
    return (
        f"{column} takes {ok[column].dropna().astype(str).nunique()} values, but the deployments "
        f"also differ in {shown or 'nothing comparable'}: not compared"
    )
