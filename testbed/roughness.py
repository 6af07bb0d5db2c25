"""How rough a run's noise is: the figures the synthetic generator is fitted to (pure).

From ``pairs.request_frame`` rows of a run with the ``recompute`` and ``pull`` flows, on
turn 1 (identical work in both flows, so everything but noise cancels):

- ``aa_sd``: the A/A spread, the SD over repetitions of a repetition's turn-1 log ratio
  pull / recompute (~ a relative difference), pooled over the history lengths;
- ``block_corr``: the correlation, over blocks (a history length's repetition: both flows),
  of the two flows' Point residuals (log of a Point's mean turn-1 TTFT less the mean of its
  (flow, length));
- ``lag1``: the lag-1 autocorrelation of those residuals over the run order;
- ``point_kurtosis``: their excess kurtosis (0 for a normal; stalled Points raise it);
- ``request_kurtosis``: the excess kurtosis of a request's log TTFT less its wave's mean
  log (the requests of one turn of one Point): stalled requests raise it.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from analysis.load.runs import load_runs
from analysis.method.pairs import CLUSTER, STRATUM, request_frame


@dataclass(frozen=True)
class Roughness:
    aa_sd: float
    block_corr: float
    lag1: float
    point_kurtosis: float
    request_kurtosis: float
    points: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _kurtosis(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    if len(x) < 4 or not x.std():
        return math.nan
    z = (x - x.mean()) / x.std()
    return float((z**4).mean() - 3.0)


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or not a[ok].std() or not b[ok].std():
        return math.nan
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def roughness(req: pd.DataFrame, pull_flow: str = "pull") -> Roughness:
    """The figures above, over every deployment of ``req`` (each centred on its own)."""
    first = req[(req["turn"] == 1) & req["flow"].isin(["recompute", pull_flow])]
    first = first[first["ttft_ms"] > 0].assign(log=lambda f: np.log(f["ttft_ms"]))
    per_point = first.groupby([*CLUSTER, "flow", "point_id"], as_index=False).agg(
        log=("log", "mean"), order=("order_index", "first")
    )
    group = per_point.groupby([*STRATUM, "flow"])["log"].transform("mean")
    per_point["resid"] = per_point["log"] - group
    wide = per_point.pivot_table(index=CLUSTER, columns="flow", values="resid")
    block = _corr(*(wide[f].to_numpy(float) for f in ("recompute", pull_flow)))
    lags = []
    for _, d in per_point.sort_values("order").groupby("deployment_id"):
        r = d["resid"].to_numpy(float)
        lags.append((r[:-1], r[1:]))
    lag1 = _corr(*(np.concatenate(p) for p in zip(*lags, strict=True))) if lags else math.nan
    logs = per_point.pivot_table(index=CLUSTER, columns="flow", values="log")
    ratio = (logs[pull_flow] - logs["recompute"]).rename("d").reset_index()
    by_length = ratio.groupby(STRATUM)["d"].agg(["var", "size"]).dropna()
    dof = (by_length["size"] - 1).sum()
    aa = math.sqrt((by_length["var"] * (by_length["size"] - 1)).sum() / dof) if dof else math.nan
    wave_mean = first.groupby(["point_id", "turn"])["log"].transform("mean")
    within = (first["log"] - wave_mean).to_numpy(float)
    return Roughness(
        aa_sd=aa,
        block_corr=block,
        lag1=lag1,
        point_kurtosis=_kurtosis(per_point["resid"].to_numpy(float)),
        request_kurtosis=_kurtosis(within),
        points=len(per_point),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m testbed.roughness RUN_DIR...``: each run's figures, one JSON line each."""
    dirs = sys.argv[1:] if argv is None else argv
    if not dirs:
        print("usage: python -m testbed.roughness RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        return 2
    for run_dir in dirs:
        figures = roughness(request_frame(load_runs([run_dir])))
        print(json.dumps({"run": run_dir, **figures.to_dict()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
