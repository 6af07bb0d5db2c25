"""Does the calibration check catch a wrong interval? The method and its deliberate breaks on
seeded synthetic crossing runs (``Noise.rough``, the runner's randomized blocks), each
through ``testbed.calibration``'s checks (coverage at 50% and 95% of the cells at every
length and of the band at both ends and at the true crossover, the crossover's coverage,
power floors).

Breaks (each changes the interval method only, never the data):

- ``se x0.8`` / ``se x1.25``: every standard error scaled;
- ``z for t``: normal quantiles instead of Student's t, everywhere;
- ``no Rao-Wu``: the plain bootstrap's variance, ``(R - 1) / R`` of the rescaled one;
- ``pooled df``: ``sum (R_s - 1)`` degrees of freedom instead of Welch-Satterthwaite's;
- ``no strata``: every repetition in one stratum (the history lengths ignored);
- ``wrong repetitions``: pull's repetition ``r`` paired with recompute's ``r + 1``;
- ``no repetition level``: every request its own cluster.

    .venv/bin/python -m benchmarks.calibration --runs 400      # the full set, minutes

The unit tier (``tests/unit/test_analysis_calibration.py``) runs the same on fewer seeds.
Prints every check and saves ``benchmarks/results/calibration-<date>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

from analysis.load.runs import records_to_run_data
from analysis.method import stats
from analysis.method.pairs import paired, request_frame, waves
from analysis.method.pull_recompute import fit_waves
from analysis.method.saving_curve import crossover
from testbed.calibration import RunEstimates, calibration, run_estimates
from testbed.synthetic import Noise, RunOrder, SyntheticDeployment, synthetic_records

HISTORIES = (128, 512, 1024, 1536, 2048)
USER, OUTPUT = 64, 16  # turn 2's history is the length + 80
# a pull with a 40 ms fixed cost: recompute wins at short histories, pull above ~881 tokens
CROSSING = SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=0.04)
# truths the quadratic fit does not have (the method only, no breaks): a +10 ms step per
# 1,024-token prefill chunk; a pull whose per-byte time saturates at 10 ms
TRUTHS = {
    "quadratic": CROSSING,
    "stepped": replace(CROSSING, chunk_tokens=1024, chunk_step_s=0.010),
    "saturating": replace(CROSSING, beta_bytes_per_s=0.1e9, transfer_cap_s=0.010),
}


NOISES = {
    "rough": Noise.rough(),
    # its body without the stalls: a stalled repetition widens its own interval, so with
    # stalls the t interval over-covers at 50% and a check there loses power
    "body": replace(Noise.rough(), stall_share=0.0, point_stall_share=0.0),
}


def design(seed: int, repetitions: int = 3) -> dict:
    return {"repetitions": repetitions, "conversations": 2 + seed % 2, "seed": seed}


def generate(seed: int, dep: SyntheticDeployment = CROSSING, noise: Noise | None = None,
             repetitions: int = 3) -> pd.DataFrame:  # fmt: skip
    """One crossing run's requests (``pairs.request_frame`` rows)."""
    syn = synthetic_records(
        [dep],
        histories=HISTORIES,
        turns=2,
        user_tokens=USER,
        output_tokens=OUTPUT,
        flows=("recompute", "pull"),
        noise=noise or Noise.rough(),
        traces=False,
        order=RunOrder.BLOCKS,
        **design(seed, repetitions),
    )
    return request_frame(records_to_run_data(syn.points))


def estimates(req: pd.DataFrame, dep: SyntheticDeployment = CROSSING) -> RunEstimates:
    """The method on one run: cells (``stats.mean_verdict`` of the wave means per length),
    the saving curve, the crossover."""
    later = paired(req, "recompute", "pull")
    later = later[later["turn"] >= 2]
    w = waves(later)
    curve = fit_waves(w, len(later))
    cells = []
    for _, g in w.groupby(["h", "turn"]):
        v = stats.mean_verdict(g["d_ms"].to_numpy(float))
        cells.append((float(g["x"].mean()), v.estimate, v.se, v.df, v.decided))
    truth = dep.exact_crossover() if dep.quadratic else dep.crossover_tokens(USER)
    return run_estimates(
        curve, cells, crossover(curve), lambda x: 1e3 * dep.saving_s(x, USER), truth
    )


# ---- breaks ----------------------------------------------------------------------------------

_linear = stats.rao_wu_spread


def _variant(rescale: bool = True, pooled: bool = False, scale: float = 1.0):
    """``stats.linear_interval`` with one part of the method changed."""

    def linear(contrib, strata):
        c = np.asarray(contrib, float)
        c = c[:, None] if c.ndim == 1 else c
        strata = np.asarray(strata)
        parts, dfs = [], []
        for s, n in stats.strata_sizes(strata).items():
            rows = c[strata == s]
            if n < 2:
                continue
            dev = rows - rows.mean(axis=0)
            parts.append((n / (n - 1) if rescale else 1.0) * (dev**2).sum(axis=0))
            dfs.append(n - 1)
        s0 = _linear(contrib, strata)
        if not parts:
            return s0
        v = np.array(parts)
        df = (
            np.full_like(s0.df, float(sum(dfs)))
            if pooled
            else stats.satterthwaite(v, np.array(dfs))
        )
        return replace(s0, se=np.sqrt(v.sum(axis=0)) * scale, df=df)

    return linear


def _normal_crits(df, level=stats.LEVEL):
    d = np.asarray(df, float)
    return np.where(d > 0, norm.ppf(0.5 + level / 2.0), np.nan)


def _patched(linear=None, crits=None) -> contextlib.AbstractContextManager:
    """The analysis with one part of its interval method broken (``stats.method``)."""
    parts = {"linear_interval": linear, "t_crits": crits}
    return stats.method(**{k: v for k, v in parts.items() if v is not None})


def _no_strata(contrib, strata):
    return _linear(contrib, np.zeros(len(np.asarray(strata)), int))


def _shift_pull_repetitions(req: pd.DataFrame) -> pd.DataFrame:
    reps = req.groupby("h")["repetition"].transform("max") + 1
    pull = req["flow"] == "pull"
    out = req.copy()
    out.loc[pull, "repetition"] = (req.loc[pull, "repetition"] + 1) % reps[pull]
    return out


def _request_clusters(req: pd.DataFrame) -> pd.DataFrame:
    return req.assign(repetition=req["repetition"] * 1000 + req["conversation"])


@dataclass(frozen=True)
class Break:
    name: str
    context: Callable[[], contextlib.AbstractContextManager]
    data: Callable[[pd.DataFrame], pd.DataFrame] = lambda req: req


BREAKS = (
    Break("se x0.8", lambda: _patched(linear=_variant(scale=0.8))),
    Break("se x1.25", lambda: _patched(linear=_variant(scale=1.25))),
    Break("z for t", lambda: _patched(crits=_normal_crits)),
    Break("no Rao-Wu", lambda: _patched(linear=_variant(rescale=False))),
    Break("pooled df", lambda: _patched(linear=_variant(pooled=True))),
    Break("no strata", lambda: _patched(linear=_no_strata)),
    Break("wrong repetitions", contextlib.nullcontext, _shift_pull_repetitions),
    Break("no repetition level", contextlib.nullcontext, _request_clusters),
)


def checked(
    runs: list[pd.DataFrame],
    brk: Break | None = None,
    floors=(0.0, 0.0),
    dep: SyntheticDeployment = CROSSING,
):
    """The calibration checks of the method (or of ``brk``) on these runs."""
    if brk is None:
        return calibration([estimates(r, dep) for r in runs], *floors)
    with brk.context():
        return calibration([estimates(brk.data(r)) for r in runs], *floors)


# power floors: the shares the method decides on these runs (measured: the module's JSON)
CELLS_DECIDED = 0.0
CROSSOVERS_DECIDED = 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--noise", choices=sorted(NOISES), action="append")
    ap.add_argument("--truth", choices=sorted(TRUTHS), action="append")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    started, load = time.time(), os.getloadavg()
    results: dict[str, dict] = {}
    for truth in args.truth or []:  # the method only, on the rough noise
        dep = TRUTHS[truth]
        runs = [generate(s, dep, repetitions=args.repetitions) for s in range(args.runs)]
        checks = checked(runs, dep=dep)
        results[f"{truth} truth"] = {"method": [{**vars(c), "passed": c.passed} for c in checks]}
        root = dep.crossover_tokens(USER)
        print(f"{truth} truth (crossover at turn 2: {root:,.0f} tokens), rough noise:")
        for c in checks:
            print(f"  {c.line()}", flush=True)
    for noise in args.noise or ([] if args.truth else sorted(NOISES)):
        runs = [generate(s, noise=NOISES[noise], repetitions=args.repetitions)
                for s in range(args.runs)]  # fmt: skip
        method = checked(runs)
        by = {c.name: c.rate for c in method}
        floors = (by["cells decided"], by["crossovers decided"])
        results[noise] = {}
        for name, brk in [("method", None), *((b.name, b) for b in BREAKS)]:
            checks = checked(runs, brk, floors)
            results[noise][name] = [{**vars(c), "passed": c.passed} for c in checks]
            bad = sum(not c.passed for c in checks)
            print(f"{noise} noise, {name}: {'calibrated' if not bad else f'{bad} check(s) fail'}")
            for c in checks:
                print(f"  {c.line()}", flush=True)
    day = time.strftime("%Y-%m-%d")
    out = args.out or Path(__file__).parent / "results" / f"calibration-{day}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {"date": day, "host_cpus": os.cpu_count(), "load_avg_start": load,
           "load_avg_end": os.getloadavg(), "seconds": time.time() - started}  # fmt: skip
    noise = "Noise.rough() (body: without stalls), RunOrder.BLOCKS"
    out.write_text(json.dumps({"benchmark": "calibration", "environment": env,
                               "runs": args.runs, "repetitions": args.repetitions,
                               "noise": noise, "results": results}, indent=1) + "\n")  # fmt: skip
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
