"""What the preset questions compare (pure): the TTFT of turns >= 2, per Point or pooled
over Points, and families of deployments that differ by one setting only.

TTFT of turns >= 2 only: at turn 1 nothing is cached anywhere and every flow computes the
whole prompt. A Point's (or a group's) TTFT p50 is the median of its ``ok`` requests of
turns >= 2 from the request records; a Point without records counts each turn's p50 once
per request of that turn (``by_turn``), an approximation of the same median.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pandas as pd

from analysis.load import RunData

LATER = "turns >= 2"
FEW_REQUESTS = 5  # fewer requests than this behind a median: say it is noisy


def later_requests(data: RunData) -> pd.DataFrame:
    """Columns ``point_id ttft_ms turn path``: every ok request of turns >= 2 of ok Points."""
    cols = ["point_id", "ttft_ms", "turn", "path"]
    ok = data.ok_points
    if not len(ok):
        return pd.DataFrame(columns=cols)
    ids = set(ok["point_id"])
    parts, have = [], set()
    req = data.requests
    if len(req) and {"turn", "ttft_ms"} <= set(req.columns):
        r = req[req["point_id"].isin(ids) & (req["turn"] >= 2)]
        if "status" in r:
            r = r[r["status"] == "ok"]
        r = r if "path" in r else r.assign(path="")
        parts.append(r[cols])
        have = set(req[req["point_id"].isin(ids)]["point_id"])
    turns = data.turns
    if len(turns):
        t = turns[turns["point_id"].isin(ids - have) & (turns["turn"] >= 2)]
        t = t[t["requests"] > 0]
        if len(t):
            n = t["requests"].astype(int).to_numpy()
            parts.append(
                pd.DataFrame(
                    {
                        "point_id": np.repeat(t["point_id"].to_numpy(), n),
                        "ttft_ms": np.repeat(t["ttft_ms_p50"].to_numpy(float), n),
                        "turn": np.repeat(t["turn"].to_numpy(), n),
                        "path": "",
                    }
                )
            )
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def point_ttft(data: RunData) -> pd.DataFrame:
    """One row per ok Point with ``ttft_ms`` (p50, turns >= 2), ``n`` (requests behind it)
    and ``flagged``, beside the Point's own columns."""
    ok = data.ok_points
    if not len(ok):
        return pd.DataFrame(columns=["point_id", "ttft_ms", "n", "flagged"])
    later = later_requests(data)
    stats = later.groupby("point_id")["ttft_ms"].agg(["median", "size"])
    out = ok.merge(stats, left_on="point_id", right_index=True, how="left")
    out = out.rename(columns={"median": "ttft_ms", "size": "n"})
    out["n"] = out["n"].fillna(0).astype(int)
    counts = out["flag_count"] if "flag_count" in out else out["flags"].astype(bool)
    out["flagged"] = counts.fillna(0).astype(int) > 0
    out["pulled_share"] = out["point_id"].map(pulled_share(data.turns)).astype(float)
    return out.reset_index(drop=True)


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


def pooled_ttft(later: pd.DataFrame, point_ids) -> tuple[float, int]:
    """(median TTFT, requests) of the turns >= 2 of several Points together."""
    rows = later[later["point_id"].isin(set(point_ids))]["ttft_ms"]
    return (float(rows.median()) if len(rows) else float("nan")), int(len(rows))


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


def ms(value: float | None, flagged: bool = False) -> str:
    """``87 ms``, ``8.7 ms``, ``30,187 ms``; a trailing ``*`` when from a flagged Point."""
    if value is None or not np.isfinite(value):
        return "n/a"
    text = f"{value:,.1f} ms" if abs(value) < 10 else f"{value:,.0f} ms"
    return text + ("*" if flagged else "")


def rel(value: float, base: float) -> str:
    """``-23%`` / ``+5%`` / ``x12`` of ``value`` against ``base``."""
    if not base or not np.isfinite(base) or not np.isfinite(value):
        return "n/a"
    ratio = value / base
    if abs(ratio - 1) < 0.005:
        return "±0%"
    return f"x{ratio:,.1f}" if ratio >= 3 else f"{ratio - 1:+.0%}"


def tokens(value: Any) -> str:
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def span(counts: pd.Series) -> str:
    """``2`` or ``2-6``: the range of a count column."""
    lo, hi = int(counts.min()), int(counts.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"
