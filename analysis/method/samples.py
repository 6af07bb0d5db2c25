"""Which measurements feed which cost model: selections from the loaded dataframes (pure).

(Pull vs recompute pairs are ``pairs.py``'s.)

- recompute cost: every turn of the ``recompute`` flow and turn 1 of ``pull`` /
  ``decode_first`` when nothing was pulled (the same route), x = prompt tokens computed
  (server counter; the prompt length when the counter is absent), one sample per wave
  (its TTFT p50), clustered by Point; ``agg`` only when the deployment has no P/D flow;
- transfer cost: the history pulls only (``P<-D``: what pull costs; the hand-off ``D<-P``
  is common to both flows), from the deployment's per-transfer traces, clustered by Point;
  without two pulled sizes there, transfer-bench ``READ`` records of the same TP split
  (same model, then same UCX_TLS; the layout with most records), one cluster each. The
  fit needs three sizes or more to predict (``fits.MIN_TRANSFER_SIZES``).
"""

from __future__ import annotations

import pandas as pd

from analysis.method.fits import MIN_TRANSFER_SIZES

PULL_FLOWS = ("pull", "decode_first")


def _ok_turns(turns: pd.DataFrame, dep_id: str) -> pd.DataFrame:
    if not len(turns):
        return turns
    rows = turns[(turns["deployment_id"] == dep_id) & (turns["status"] == "ok")]
    return rows[rows["requests"] > 0]


def recompute_samples(turns: pd.DataFrame, dep_id: str) -> pd.DataFrame:
    """Columns ``tokens ttft_s flow turn point_id``: waves whose TTFT is computing them."""
    rows = _ok_turns(turns, dep_id)
    if not len(rows):
        return pd.DataFrame(columns=["tokens", "ttft_s", "flow", "turn", "point_id"])
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
            "point_id": sel["point_id"],
        }
    ).reset_index(drop=True)


def _distinct(values: pd.Series) -> int:
    return int(values.dropna().nunique())


PULLS = "P<-D"
BENCH_SOURCE = "transfer bench"  # how a source of bench records is described
NO_TRANSFER_SAMPLES = (
    "no traced P<-D pulls (run with connector.trace=true) and no transfer-bench records with "
    "two sizes (add a +experiment=transfer_bench run dir to the analysis)"
)
SAMPLE_COLUMNS = ["bytes", "seconds", "cluster"]


def trace_samples(
    traces: pd.DataFrame, dep_id: str, bytes_per_token: float | None = None
) -> pd.DataFrame:
    """The deployment's traced history pulls (``P<-D``): ``bytes seconds cluster`` (the
    Point, or the line itself when no Point is known). A line without a size (telemetry
    off) gets ``tokens x bytes_per_token``."""
    if not len(traces):
        return pd.DataFrame(columns=SAMPLE_COLUMNS)
    rows = traces[
        (traces["deployment_id"] == dep_id)
        & (traces["transfer_s"] > 0)
        & (traces["direction"] == PULLS)
    ]
    nbytes = rows["bytes"]
    if bytes_per_token:
        nbytes = nbytes.fillna(rows["tokens"].astype(float) * bytes_per_token)
    rows = rows.assign(bytes=nbytes)
    rows = rows[rows["bytes"] > 0]
    point = rows["point_id"].fillna("").astype(str)
    own = pd.Series([f"line{i}" for i in range(len(rows))], index=rows.index)
    return pd.DataFrame(
        {
            "bytes": rows["bytes"],
            "seconds": rows["transfer_s"],
            "cluster": point.where(point != "", own),
        }
    )


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
    dep_id: str,
    tp_split: str,
    model: str,
    ucx_tls: str = "",
    bytes_per_token: float | None = None,
) -> tuple[pd.DataFrame, str]:
    """(``bytes seconds cluster`` samples, a description of the source), empty when none.

    The traces when they hold ``MIN_TRANSFER_SIZES`` pulled sizes, else the bench when it does, else
    whichever has more sizes (two at least)."""
    tr = trace_samples(traces, dep_id, bytes_per_token).reset_index(drop=True)
    tr_desc = f"P<-D traces ({len(tr)} pulls, {_distinct(tr['bytes'])} sizes)"
    b = bench_candidates(bench, tp_split, model, ucx_tls)
    if "op" in b:
        b = b[b["op"].astype(str).str.upper() == "READ"]
    what = ", ".join(
        f"{col} {b[col].iloc[0]}" for col in ("op", "layout", "tp_split", "model") if col in b
    )
    bench_desc = f"{BENCH_SOURCE} ({len(b)} records, {_distinct(b['bytes'])} sizes: {what})"
    bench_frame = pd.DataFrame(
        {
            "bytes": b["bytes"].to_numpy(float),
            "seconds": b["median_s"].to_numpy(float),
            "cluster": [f"bench{i}" for i in range(len(b))],
        }
    )
    n_tr, n_b = _distinct(tr["bytes"]), (_distinct(b["bytes"]) if len(b) else 0)
    if n_tr >= MIN_TRANSFER_SIZES or (n_tr >= 2 and n_tr >= n_b):
        return tr, tr_desc
    if n_b >= 2:
        return bench_frame, bench_desc + (f"; the traces had {n_tr} pulled sizes" if n_tr else "")
    return pd.DataFrame(columns=SAMPLE_COLUMNS), ""
