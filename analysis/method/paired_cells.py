"""Pull against recompute per workload cell, any request metric, with ``stats``' intervals.

A *cell* is a (deployment, workload kind) whose Points differ only by flow and repetition
(``load.shape_kinds`` puts a swept conversation count or concurrency into ``kind``). Within
a cell, a request pairs with its twin in the other flow by (history length, repetition,
conversation, turn), as in ``pairs``; a repetition's pairs are averaged into one value (the
cluster of ``stats``), and the cell's estimate with its 95% interval is
``stats.mean_verdict`` over those values. Point-level numbers (a record's ``decode_bill``)
pair the same way, by repetition.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load.runs import RunData
from analysis.method.stats import Verdict, mean_verdict

CELL = ["deployment_id", "kind"]
TWIN = ["h", "repetition", "conversation", "turn"]


def request_metrics(data: RunData, columns: tuple[str, ...]) -> pd.DataFrame:
    """Ok requests of ok Points: ``CELL``, ``TWIN``, ``flow``, ``path`` and ``columns``."""
    req, ok = data.requests, data.ok_points
    keep = [*CELL, *TWIN, "flow", "path", "point_id", *columns]
    if not len(req) or not len(ok) or not set(columns) <= set(req.columns):
        return pd.DataFrame(columns=keep)
    r = req[req["point_id"].isin(set(ok["point_id"]))]
    if "status" in r:
        r = r[r["status"] == "ok"]
    r = r.rename(columns={"point_history_tokens": "h"}).copy()
    r["kind"] = r["kind"].fillna("").astype(str)
    r["path"] = r["path"].fillna("") if "path" in r else ""
    return r[keep].reset_index(drop=True)


def per_repetition(
    req: pd.DataFrame, a: str, b: str, column: str, first_turn: int = 2
) -> pd.DataFrame:
    """Per (cell, repetition): the mean of ``column`` in flow ``a`` minus its twin in ``b``
    over turns >= ``first_turn`` (``d``), and the pairs behind it (``n``)."""
    cols = [*CELL, "repetition", "d", "n"]
    r = req[(req["turn"] >= first_turn) & np.isfinite(req[column].astype(float))]
    key = [*CELL, *TWIN]
    left = r[r["flow"] == a].groupby(key, as_index=False)[column].mean()
    right = r[r["flow"] == b].groupby(key, as_index=False)[column].mean()
    m = left.merge(right, on=key, suffixes=("_a", "_b"))
    if not len(m):
        return pd.DataFrame(columns=cols)
    m["d"] = m[f"{column}_a"] - m[f"{column}_b"]
    g = m.groupby([*CELL, "repetition"], as_index=False)
    out = g["d"].mean()
    out["n"] = g.size()["size"].to_numpy()
    return out[cols]


def point_difference(points: pd.DataFrame, a: str, b: str, column: str) -> pd.DataFrame:
    """Per (cell, repetition): Point-level ``column`` of flow ``a`` minus flow ``b``."""
    cols = [*CELL, "repetition", "d", "n"]
    p = points[points["status"] == "ok"]
    if column not in p or not len(p):
        return pd.DataFrame(columns=cols)
    key = [*CELL, "repetition"]
    left = p[p["flow"] == a].groupby(key, as_index=False)[column].mean()
    right = p[p["flow"] == b].groupby(key, as_index=False)[column].mean()
    m = left.merge(right, on=key, suffixes=("_a", "_b"))
    m["d"] = m[f"{column}_a"] - m[f"{column}_b"]
    m["n"] = 1
    return m[cols]


def point_level(points: pd.DataFrame, flow: str, column: str) -> pd.DataFrame:
    """Per (cell, repetition): the Point-level ``column`` of ``flow`` (as ``d``)."""
    cols = [*CELL, "repetition", "d", "n"]
    p = points[(points["status"] == "ok") & (points["flow"] == flow)]
    if column not in p or not len(p):
        return pd.DataFrame(columns=cols)
    out = p.groupby([*CELL, "repetition"], as_index=False)[column].mean()
    out = out.rename(columns={column: "d"})
    out["n"] = 1
    return out[cols]


def verdict(per_rep: pd.DataFrame, deployment_id: str, kind: str, unit: str = "ms") -> Verdict:
    """The cell's mean over its repetitions with the 95% interval (``stats.mean_verdict``)."""
    rows = per_rep[(per_rep["deployment_id"] == deployment_id) & (per_rep["kind"] == kind)]
    values = rows["d"].to_numpy(float)
    return mean_verdict(values, unit, int(rows["n"].sum()) if len(rows) else 0)


def cells(points: pd.DataFrame, flows: tuple[str, ...]) -> list[tuple[str, str]]:
    """(deployment, kind) cells with an ok Point of every one of ``flows``."""
    p = points[points["status"] == "ok"]
    if not len(p):
        return []
    have = p.groupby(CELL)["flow"].agg(set)
    return [cell for cell, fl in have.items() if set(flows) <= fl]
