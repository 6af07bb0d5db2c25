"""Is the effect the crossover preset measures larger than its noise on this machine?

Reads finished run dirs of ``python -m pdbench +experiment=crossover`` (or any run with the
``recompute`` and ``pull`` flows, repetitions and two turns) and prints, per run and over
all of them:

- the A/A noise: turn 1 does the same work in both flows, so each repetition's paired
  difference (pull - recompute, mean over its conversations) is noise; its spread over the
  repetitions (SD) and the per-request SD;
- the effect: turn 2's TTFT of each flow per history length (mean and SD over the
  repetitions), and what recomputing the longest history costs beyond the shortest, in
  units of the A/A noise;
- where TTFT goes (the TTFT split's mean parts and the residual's own parts) per flow at the
  shortest and the longest history;
- the run's wall time (manifest ``created_at`` -> the last Point's ``finished_at``);
- the run's answer as ``python -m analysis`` gave it (``analysis/summary.json``, when the
  run was analysed): the crossover with its 95% interval, the recommended threshold and the
  A/A control; over several runs, the lengths inside every run's interval (empty: the runs
  disagree beyond their intervals).

    .venv/bin/python -m benchmarks.crossover_effect results/crossover-A results/crossover-B

Saves ``benchmarks/results/crossover_effect-<date>.json`` (or ``--out PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from records.point import TTFT_SPLIT_PARTS as PARTS


def _sd(values: list[float]) -> float:
    return st.stdev(values) if len(values) > 1 else float("nan")


def load(run_dir: Path) -> tuple[list[dict], dict[str, list[dict]], dict]:
    points = [json.loads(p.read_text()) for p in sorted((run_dir / "points").glob("*.json"))]
    requests = {}
    for p in points:
        path = run_dir / p["requests_file"]
        lines = path.read_text().splitlines() if path.exists() else []
        requests[p["point_id"]] = [json.loads(x) for x in lines if x.strip()]
    return points, requests, json.loads((run_dir / "manifest.json").read_text())


def verdicts(run_dir: Path) -> dict[str, Any] | None:
    """The crossover, threshold and control ``python -m analysis`` wrote (first deployment)."""
    path = run_dir / "analysis" / "summary.json"
    if not path.exists():
        return None
    questions = json.loads(path.read_text()).get("questions", {})
    cross = (questions.get("crossover") or [{}])[0]
    control = (questions.get("control") or [{}])[0]
    measured = cross.get("measured", {})
    diff = control.get("pull_minus_recompute", {})
    return {
        "crossover_tokens": measured.get("tokens"),
        "crossover_low": measured.get("low"),
        "crossover_high": measured.get("high"),
        "crossover_verdict": measured.get("verdict"),
        "crossover_text": measured.get("text", ""),
        "predicted_fit": cross.get("predicted_fit"),
        "recommended_kv_recompute_threshold": cross.get("recommended_kv_recompute_threshold"),
        "control_ms": diff.get("estimate"),
        "control_low": diff.get("low"),
        "control_high": diff.get("high"),
        "control_invalid": control.get("invalid"),
        "control_text": control.get("text", ""),
    }


def common_interval(runs: list[dict[str, Any]]) -> list[float] | None:
    """The lengths inside every run's crossover interval, or None when they share none."""
    bounds = [
        (v["crossover_low"], v["crossover_high"])
        for v in (r.get("verdicts") for r in runs)
        if v and v["crossover_low"] is not None and v["crossover_high"] is not None
    ]
    if len(bounds) < 2:
        return None
    low, high = max(b[0] for b in bounds), min(b[1] for b in bounds)
    return [low, high] if low <= high else None


def analyse(run_dir: Path) -> dict[str, Any]:
    points, requests, manifest = load(run_dir)
    ok = [p for p in points if p["status"] == "ok"]
    # (flow, history, repetition, turn) -> {conversation: ttft}
    cells: dict[tuple, dict[int, float]] = defaultdict(dict)
    split: dict[tuple, list[dict]] = defaultdict(list)
    for p in ok:
        h, rep = p["workload"]["history_tokens"], p.get("repetition", 0)
        for r in requests[p["point_id"]]:
            if r["status"] != "ok":
                continue
            cells[(p["flow"], h, rep, r["turn"])][r["conversation"]] = r["ttft_ms"]
            if r.get("ttft_split"):
                split[(p["flow"], h, r["turn"])].append(r)
    histories = sorted({k[1] for k in cells})
    reps = sorted({k[2] for k in cells})
    aa_rep, aa_req = [], []
    for h in histories:
        for rep in reps:
            a, b = cells.get(("pull", h, rep, 1), {}), cells.get(("recompute", h, rep, 1), {})
            pairs = [a[c] - b[c] for c in a if c in b]
            if pairs:
                aa_rep.append(st.fmean(pairs))
                aa_req += pairs
    turn2 = {}
    for flow in ("recompute", "pull"):
        for h in histories:
            means = [
                st.fmean(cells[(flow, h, r, 2)].values()) for r in reps if (flow, h, r, 2) in cells
            ]
            if means:
                turn2[f"{flow}@{h}"] = {"mean": st.fmean(means), "sd": _sd(means), "n": len(means)}
    aa_sd = _sd(aa_rep)
    lo, hi = histories[0], histories[-1]
    cost = turn2.get(f"recompute@{hi}", {}).get("mean", 0.0) - turn2.get(f"recompute@{lo}", {}).get(
        "mean", 0.0
    )
    where = {}
    for (flow, h, turn), recs in sorted(split.items()):
        if h not in (lo, hi):
            continue
        parts = {k: st.fmean(r["ttft_split"][k] for r in recs) for k in PARTS}
        keys = sorted({k for r in recs for k in r.get("ttft_residual_ms", {})})
        residual = {
            k: st.fmean(r["ttft_residual_ms"][k] for r in recs if k in r["ttft_residual_ms"])
            for k in keys
        }
        sources = sorted({r.get("split_source", "") for r in recs})
        where[f"{flow}@{h} turn {turn}"] = {
            "ttft_ms": st.fmean(r["ttft_ms"] for r in recs),
            "parts": parts,
            "residual_parts": residual,
            "requests": len(recs),
            "sources": sources,
        }
    finished = max((p.get("finished_at", 0.0) for p in points), default=0.0)
    return {
        "run_dir": str(run_dir),
        "model": manifest["config"]["model"]["name"],
        "repetitions": len(reps),
        "histories": histories,
        "points_ok": len(ok),
        "points": len(points),
        "wall_s": finished - manifest.get("created_at", finished),
        "aa_rep_mean_ms": st.fmean(aa_rep) if aa_rep else float("nan"),
        "aa_rep_sd_ms": aa_sd,
        "aa_request_sd_ms": _sd(aa_req),
        "turn2": turn2,
        "recompute_longest_minus_shortest_ms": cost,
        "effect_over_aa_noise": cost / aa_sd if aa_sd and aa_sd == aa_sd else float("nan"),
        "where_ttft_goes": where,
        "verdicts": verdicts(run_dir),
    }


def show(result: dict[str, Any]) -> None:
    cost, ratio = result["recompute_longest_minus_shortest_ms"], result["effect_over_aa_noise"]
    print(
        f"{result['run_dir']}: {result['model']}, {result['repetitions']} repetitions, "
        f"{result['points_ok']}/{result['points']} Points ok, wall {result['wall_s']:.0f} s"
    )
    print(
        f"  A/A (turn 1, pull - recompute): mean {result['aa_rep_mean_ms']:+.1f} ms, SD over "
        f"repetitions {result['aa_rep_sd_ms']:.1f} ms, per request "
        f"{result['aa_request_sd_ms']:.1f} ms"
    )
    for key, v in result["turn2"].items():
        print(f"  turn 2 {key:>16}: {v['mean']:8.1f} ms  (SD {v['sd']:.1f} over {v['n']} reps)")
    print(
        f"  recomputing the longest history costs {cost:.0f} ms more than the shortest: "
        f"{ratio:.1f}x the A/A SD"
    )
    v = result["verdicts"]
    if v:
        print(f"  crossover {v['crossover_text']} ({v['crossover_verdict']})")
        print(f"  {v['control_text']}")
    else:
        print("  no analysis/summary.json: run `python -m analysis` on it for its verdicts")
    for key, v in result["where_ttft_goes"].items():
        parts = ", ".join(f"{k[:-3]} {x:.1f}" for k, x in v["parts"].items())
        residual = ", ".join(f"{k[:-3]} {x:.1f}" for k, x in v["residual_parts"].items())
        print(
            f"  {key}: TTFT {v['ttft_ms']:.1f} = {parts} (residual: {residual}; "
            f"{v['requests']} requests, {'/'.join(v['sources'])})"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    results = [analyse(d) for d in args.run_dirs]
    for r in results:
        show(r)
    if len(results) > 1:
        ratios = [r["effect_over_aa_noise"] for r in results]
        walls = [r["wall_s"] for r in results]
        print(
            f"over {len(results)} runs: effect / A/A SD {min(ratios):.1f}-{max(ratios):.1f}, "
            f"wall {min(walls):.0f}-{max(walls):.0f} s"
        )
        shared = common_interval(results)
        print(
            f"crossover lengths inside every run's 95% interval: {shared[0]:.0f}-{shared[1]:.0f}"
            if shared
            else "the runs' crossover intervals share no length (or fewer than two were analysed)"
        )
    out = (
        args.out
        or Path("benchmarks/results") / f"crossover_effect-{time.strftime('%Y-%m-%d')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "machine": os.uname().nodename,
        "cpus": os.cpu_count(),
        "at": time.time(),
        "load_average": os.getloadavg(),
        "runs": results,
        "crossover_common_interval": common_interval(results),
    }
    out.write_text(json.dumps(record, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
