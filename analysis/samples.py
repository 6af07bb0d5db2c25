"""Which measurements feed which model: selections from the loaded dataframes (pure).

- pull vs recompute pairs: turns >= 2 of ``ok`` Points (turn 1 has no history to pull),
  matched on (workload kind, Point history length, turn); x = the turn's history tokens;
- recompute cost: every turn of the ``recompute`` flow and turn 1 of ``pull`` /
  ``decode_first`` when nothing was pulled (the same route), x = prompt tokens computed
  (server counter; the prompt length when the counter is absent); ``agg`` only when the
  deployment has no P/D flow;
- transfer cost, first source with two distinct sizes: the deployment's per-transfer
  traces (history pulls ``P<-D``, else READs, else all) > transfer-bench records of the
  same TP split (same model, then same UCX_TLS, then ``READ`` preferred; the layout with
  most records) > the pull Points' NIXL totals
  (bytes / count vs seconds / count, one sample per Point).
"""

from __future__ import annotations

import pandas as pd

PULL_FLOWS = ("pull", "decode_first")


def _ok_turns(turns: pd.DataFrame, dep_id: str) -> pd.DataFrame:
    if not len(turns):
        return turns
    rows = turns[(turns["deployment_id"] == dep_id) & (turns["status"] == "ok")]
    return rows[rows["requests"] > 0]


def paired(turns: pd.DataFrame, dep_id: str, other: str = "pull") -> pd.DataFrame:
    """Columns ``history_tokens turn x ttft_recompute_ms ttft_<other>_ms diff_ms speedup``.

    ``diff_ms`` = recompute - other: positive where ``other`` is faster.
    """
    cols = ["history_tokens", "turn", "x", "ttft_recompute_ms", f"ttft_{other}_ms"]
    rows = _ok_turns(turns, dep_id)
    if not len(rows):
        return pd.DataFrame(columns=[*cols, "diff_ms", "speedup"])
    rows = rows[rows["turn"] >= 2]
    # the workload kind too: Points of different kinds can share a swept history length
    key = ["history_tokens", "turn"] + (["kind"] if "kind" in rows else [])
    rec = rows[rows["flow"] == "recompute"][[*key, "history_tokens_mean", "ttft_ms_p50"]]
    oth = rows[rows["flow"] == other][[*key, "history_tokens_mean", "ttft_ms_p50"]]
    m = rec.merge(oth, on=key, suffixes=("_r", "_o"))
    out = pd.DataFrame(
        {
            "history_tokens": m["history_tokens"],
            "turn": m["turn"],
            "x": (m["history_tokens_mean_r"] + m["history_tokens_mean_o"]) / 2.0,
            "ttft_recompute_ms": m["ttft_ms_p50_r"],
            f"ttft_{other}_ms": m["ttft_ms_p50_o"],
        }
    )
    out["diff_ms"] = out["ttft_recompute_ms"] - out[f"ttft_{other}_ms"]
    out["speedup"] = out["ttft_recompute_ms"] / out[f"ttft_{other}_ms"].where(
        out[f"ttft_{other}_ms"] > 0
    )
    return out.sort_values("x").reset_index(drop=True)


def recompute_samples(turns: pd.DataFrame, dep_id: str) -> pd.DataFrame:
    """Columns ``tokens ttft_s flow turn``: prompts whose TTFT is computing them."""
    rows = _ok_turns(turns, dep_id)
    if not len(rows):
        return pd.DataFrame(columns=["tokens", "ttft_s", "flow", "turn"])
    pick = (rows["flow"] == "recompute") | (
        rows["flow"].isin(PULL_FLOWS) & (rows["turn"] == 1) & (rows["tokens_pulled"] <= 0)
    )
    if not pick.any():
        pick = rows["flow"] == "agg"
    sel = rows[pick]
    tokens = sel["prefill_tokens_computed"].where(
        sel["prefill_tokens_computed"] > 0, sel["prompt_tokens_mean"]
    )
    return pd.DataFrame(
        {
            "tokens": tokens.astype(float),
            "ttft_s": sel["ttft_ms_p50"].astype(float) / 1e3,
            "flow": sel["flow"],
            "turn": sel["turn"],
        }
    ).reset_index(drop=True)


def _distinct(values: pd.Series) -> int:
    return int(values.dropna().nunique())


def trace_samples(
    traces: pd.DataFrame, dep_id: str, bytes_per_token: float | None = None
) -> pd.DataFrame:
    """History pulls (``P<-D``) if two sizes were seen, else every READ, else everything.

    A line without a size (telemetry off) gets ``tokens x bytes_per_token``.
    """
    if not len(traces):
        return pd.DataFrame(columns=["bytes", "seconds"])
    rows = traces[(traces["deployment_id"] == dep_id) & (traces["transfer_s"] > 0)]
    nbytes = rows["bytes"]
    if bytes_per_token:
        nbytes = nbytes.fillna(rows["tokens"].astype(float) * bytes_per_token)
    rows = rows.assign(bytes=nbytes)
    rows = rows[rows["bytes"] > 0]
    for pick in (rows["direction"] == "P<-D", rows["op"] == "READ"):
        if _distinct(rows[pick]["bytes"]) >= 2:
            rows = rows[pick]
            break
    return pd.DataFrame({"bytes": rows["bytes"], "seconds": rows["transfer_s"]})


def bench_candidates(
    bench: pd.DataFrame, tp_split: str, model: str, ucx_tls: str = ""
) -> pd.DataFrame:
    """Usable bench records for a deployment, best-matching group only."""
    if not len(bench) or not {"bytes", "median_s"} <= set(bench.columns):
        return pd.DataFrame(columns=["bytes", "median_s"])
    ok = bench[bench["median_s"].astype(float) > 0]
    if "status" in ok:
        ok = ok[ok["status"] == "ok"]
    if "tp_split" in ok:
        same = ok[ok["tp_split"].astype(str).str.replace(" ", "") == tp_split]
        ok = same if len(same) else ok
    if "model" in ok:
        same = ok[ok["model"].astype(str) == model]
        ok = same if len(same) else ok
    if "ucx_tls" in ok:
        same = ok[ok["ucx_tls"].fillna("").astype(str) == ucx_tls]
        ok = same if len(same) else ok
    if "op" in ok:
        reads = ok[ok["op"].astype(str).str.upper() == "READ"]
        ok = reads if len(reads) else ok
    if "layout" in ok and len(ok):
        best = ok["layout"].value_counts().index[0]
        ok = ok[ok["layout"] == best]
    return ok


def transfer_samples(
    traces: pd.DataFrame,
    bench: pd.DataFrame,
    points: pd.DataFrame,
    dep_id: str,
    tp_split: str,
    model: str,
    ucx_tls: str = "",
    bytes_per_token: float | None = None,
) -> tuple[pd.DataFrame, str]:
    """(``bytes seconds`` samples, a description of the source) — empty when none."""
    tr = trace_samples(traces, dep_id, bytes_per_token)
    if _distinct(tr["bytes"]) >= 2:
        return tr.reset_index(drop=True), f"traces ({len(tr)} transfers)"
    b = bench_candidates(bench, tp_split, model, ucx_tls)
    if len(b) and _distinct(b["bytes"]) >= 2:
        what = ", ".join(
            f"{col} {b[col].iloc[0]}" for col in ("op", "layout", "tp_split", "model") if col in b
        )
        desc = f"transfer bench ({len(b)} records: {what})"
        return pd.DataFrame({"bytes": b["bytes"], "seconds": b["median_s"]}), desc
    if len(points):
        p = points[
            (points["deployment_id"] == dep_id)
            & (points["status"] == "ok")
            & points["flow"].isin(PULL_FLOWS)
            & (points["transfer_count"] > 0)
        ]
        if _distinct(p["transfer_bytes"] / p["transfer_count"]) >= 2:
            out = pd.DataFrame(
                {
                    "bytes": p["transfer_bytes"] / p["transfer_count"],
                    "seconds": p["transfer_seconds"] / p["transfer_count"],
                }
            )
            return out.reset_index(drop=True), f"NIXL totals of {len(p)} pull Points (averages)"
    return pd.DataFrame(columns=["bytes", "seconds"]), ""
