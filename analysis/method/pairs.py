"""Requests, paired across flows, and their per-repetition means (pure pandas).

Repetition ``r`` of every flow at a (deployment, workload kind, history length) uses the
same conversations (the same token ids), so a request pairs with its twin in another flow
by ``KEY``. A wave (one turn of one repetition: its requests are batched together) is
summarised by its mean; a *cluster* is one repetition of a (deployment, kind, history
length), the independent unit of ``stats``; a *stratum* is the (deployment, kind, history
length) it belongs to.

Points without request records (older runs) give one row per turn from ``by_turn``
(conversation -1, TTFT the turn's p50): a wave summarised already.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.load.runs import RunData

KEY = ["deployment_id", "kind", "h", "repetition", "conversation", "turn"]
PAIR_KEY = [k for k in KEY if k != "deployment_id"]  # a request's twin in another deployment
STRATUM = ["deployment_id", "kind", "h"]
CLUSTER = [*STRATUM, "repetition"]
WAVE = [*CLUSTER, "turn"]
COLUMNS = [*KEY, "flow", "x", "ttft_ms", "point_id", "order_index"]


def request_frame(data: RunData) -> pd.DataFrame:
    """Every ok request of every ok Point, in ``COLUMNS`` (``h``: the Point's swept history
    length, ``x``: the request's own history tokens)."""
    ok = data.ok_points
    if not len(ok):
        return pd.DataFrame(columns=COLUMNS)
    ids = set(ok["point_id"])
    parts = []
    req = data.requests
    have: set[str] = set()
    if len(req) and {"turn", "ttft_ms", "conversation"} <= set(req.columns):
        r = req[req["point_id"].isin(ids)]
        have = set(r["point_id"])
        if "status" in r:
            r = r[r["status"] == "ok"]
        r = r[np.isfinite(r["ttft_ms"].astype(float))]
        parts.append(
            pd.DataFrame(
                {
                    "deployment_id": r["deployment_id"],
                    "kind": r["kind"].fillna("").astype(str),
                    "h": r["point_history_tokens"].astype(int),
                    "repetition": r["repetition"].astype(int),
                    "conversation": r["conversation"].astype(int),
                    "turn": r["turn"].astype(int),
                    "flow": r["flow"].astype(str),
                    "x": r["history_tokens"].astype(float),
                    "ttft_ms": r["ttft_ms"].astype(float),
                    "point_id": r["point_id"],
                    "order_index": r["order_index"].astype(int),
                }
            )
        )
    turns = data.turns
    if len(turns):
        t = turns[turns["point_id"].isin(ids - have) & (turns["requests"] > 0)]
        if len(t):
            order = ok.set_index("point_id")["order_index"]
            parts.append(
                pd.DataFrame(
                    {
                        "deployment_id": t["deployment_id"],
                        "kind": t["kind"].fillna("").astype(str),
                        "h": t["history_tokens"].astype(int),
                        "repetition": t["repetition"].astype(int),
                        "conversation": -1,
                        "turn": t["turn"].astype(int),
                        "flow": t["flow"].astype(str),
                        "x": t["history_tokens_mean"].astype(float),
                        "ttft_ms": t["ttft_ms_p50"].astype(float),
                        "point_id": t["point_id"],
                        "order_index": t["point_id"].map(order).fillna(-1).astype(int),
                    }
                )
            )
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True)[COLUMNS] if parts else pd.DataFrame(columns=COLUMNS)


def paired(req: pd.DataFrame, a: str, b: str, key: list[str] | None = None) -> pd.DataFrame:
    """Requests of flow ``a`` matched with their twins in flow ``b`` on ``key``.

    Columns: ``key``, ``x`` (mean of the two), ``a_ms``, ``b_ms``, ``d_ms`` = a - b,
    ``level_ms`` = (a + b) / 2. ``key`` defaults to ``KEY`` (same deployment); leave
    ``deployment_id`` out of it to pair two deployments' requests."""
    key = KEY if key is None else key
    cols = [*key, "x", "a_ms", "b_ms", "d_ms", "level_ms"]
    if not len(req):
        return pd.DataFrame(columns=cols)
    left = _unique(req[req["flow"] == a][[*key, "x", "ttft_ms"]], key)
    right = _unique(req[req["flow"] == b][[*key, "x", "ttft_ms"]], key)
    m = left.merge(right, on=key, suffixes=("_a", "_b"))
    out = m[key].copy()
    out["x"] = (m["x_a"] + m["x_b"]) / 2.0
    out["a_ms"], out["b_ms"] = m["ttft_ms_a"], m["ttft_ms_b"]
    out["d_ms"] = out["a_ms"] - out["b_ms"]
    out["level_ms"] = (out["a_ms"] + out["b_ms"]) / 2.0
    return out[cols].reset_index(drop=True)


def _unique(rows: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    """One row per key: a key seen twice (a retried request) gets its mean."""
    if not rows.duplicated(key).any():
        return rows
    return rows.groupby(key, as_index=False).mean()


def waves(pairs: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Per wave (``WAVE`` by default): mean ``x``, ``d_ms``, ``level_ms`` and ``n`` pairs."""
    by = WAVE if by is None else by
    if not len(pairs):
        return pd.DataFrame(columns=[*by, "x", "d_ms", "level_ms", "n"])
    g = pairs.groupby(by, as_index=False)
    out = g[["x", "d_ms", "level_ms"]].mean()
    out["n"] = g.size()["size"].to_numpy()
    return out


def cluster_index(frame: pd.DataFrame, cluster: list[str], stratum: list[str]):
    """(cluster id per row, stratum id per cluster) as int arrays, in a stable order: the
    ids ``groupby(..., sort=True).ngroup()`` gives, without its cost per call (the analysis
    asks for them per fit and per interval: ~15% of the calibration test's time)."""
    firsts, cl = np.unique(key_codes(frame, cluster), return_index=True, return_inverse=True)[1:]
    st = np.unique(key_codes(frame.iloc[firsts], stratum), return_inverse=True)[1]
    return cl.reshape(-1), st.reshape(-1)


def key_codes(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """One int per row that sorts as the rows' values in ``columns`` sort (the first column
    first): each column's sorted codes combined, kept dense after each column."""
    key = np.zeros(len(frame), dtype=np.int64)
    for column in columns:
        codes, uniques = pd.factorize(frame[column], sort=True)
        if (codes < 0).any():
            raise ValueError(f"{column}: a missing value in a cluster key")
        key = np.unique(key * len(uniques) + codes, return_inverse=True)[1].reshape(-1)
    return key
