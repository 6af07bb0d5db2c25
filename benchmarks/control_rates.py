"""How often does the A/A control mark a run INVALID? Clean runs (false alarms) and runs with
a flow bias (power), on the synthetic generator's rough noise (``Noise.rough``, the runner's
randomized blocks), through ``pull_recompute.measure`` and the control question's judgement.

Shapes: ``crossover`` (the preset: 9 lengths 0-4,096 x 15 repetitions x 2 conversations,
recompute and pull) and ``demo`` (``make demo``: three deployments of 5 lengths x 6
repetitions x 4 conversations). Biases on turn 1's pull TTFT: ``+5%``, ``+10%``, ``+20%``
(every length) and ``+10ms<=128`` (10 ms added at lengths of at most 128 tokens only).

    .venv/bin/python -m benchmarks.control_rates --runs 400            # a few minutes
    .venv/bin/python -m benchmarks.control_rates --shape demo --runs 200 --bias 0

Prints a table and saves ``benchmarks/results/control_rates-<date>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from analysis.load.runs import records_to_run_data
from analysis.method.pairs import paired, request_frame
from analysis.method.pull_recompute import Control, control
from testbed.synthetic import Noise, RunOrder, SyntheticDeployment, synthetic_records


@dataclass(frozen=True)
class RunShape:
    histories: tuple[int, ...]
    repetitions: int
    conversations: int
    deployments: tuple[SyntheticDeployment, ...]


# a cpu_llama-like P: ~200 ms at an empty prompt, ~1.1 s at 4,096 tokens
CPU_LLAMA = SyntheticDeployment(c0_s=0.2, c1_s=1e-4, c2_s=3e-8, alpha_s=0.01)
SHAPES = {
    "crossover": RunShape((0, 32, 64, 128, 256, 512, 1024, 2048, 4096), 15, 2, (CPU_LLAMA,)),
    "demo": RunShape(
        (128, 512, 1024, 1536, 2048),
        6,
        4,
        tuple(
            SyntheticDeployment(c0_s=0.005, c2_s=3e-8, alpha_s=a, p_tp=1, d_tp=d)
            for a, d in ((0.04, 1), (0.05, 2), (0.06, 4))
        ),
    ),
}
BIASES = ("0", "+5%", "+10%", "+20%", "+10ms<=128")


def _biased(ms: float, h: int, bias: str) -> float:
    if bias.endswith("%"):
        return ms * (1.0 + float(bias[:-1]) / 100.0)
    if bias.startswith("+") and "ms<=" in bias:
        add, upto = bias[1:].split("ms<=")
        return ms + float(add) if h <= int(upto) else ms
    return ms


def run_controls(shape: RunShape, seed: int, bias: str = "0", noise: Noise | None = None):
    """The judged A/A controls of one synthetic run (turn 1 only: all the control reads)."""
    syn = synthetic_records(
        list(shape.deployments),
        histories=shape.histories,
        turns=1,
        conversations=shape.conversations,
        flows=("recompute", "pull"),
        noise=noise or Noise.rough(),
        seed=seed,
        repetitions=shape.repetitions,
        traces=False,
        order=RunOrder.BLOCKS,
    )
    if bias != "0":
        for point, reqs in syn.points:
            if point["flow"] == "pull":
                h = point["workload"]["history_tokens"]
                for r in reqs:
                    r["ttft_ms"] = _biased(r["ttft_ms"], h, bias)
    req = request_frame(records_to_run_data(syn.points))
    out: list[Control] = []
    for dep in shape.deployments:
        mine = req[req["deployment_id"] == dep.deployment_id]
        c = control(paired(mine, "pull", "recompute"))
        if c is not None:
            out.append(c)
    return [c.judged(len(out)) for c in out]


def invalid_rate(shape: RunShape, seeds: range, bias: str = "0") -> tuple[int, int]:
    """(runs marked INVALID, runs) over ``seeds``."""
    bad = sum(any(c.invalid for c in run_controls(shape, s, bias)) for s in seeds)
    return bad, len(seeds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), action="append")
    ap.add_argument("--bias", choices=BIASES, action="append")
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    started, load = time.time(), os.getloadavg()
    rows = []
    for name in args.shape or ["crossover", "demo"]:
        for bias in args.bias or list(BIASES):
            runs = args.runs if bias == "0" else max(args.runs // 4, 50)
            t = time.time()
            bad, n = invalid_rate(SHAPES[name], range(runs), bias)
            se = math.sqrt(max(bad, 1) * (n - bad) / n) / n
            row = {"shape": name, "bias": bias, "invalid": bad, "runs": n, "rate": bad / n}
            rows.append({**row, "binomial_se": se, "seconds": time.time() - t})
            print(f"{name:9s} bias {bias:>10s}: INVALID in {bad}/{n} = {bad / n:.1%} "
                  f"(+-{se:.1%}), {time.time() - t:.0f} s", flush=True)  # fmt: skip
    day = time.strftime("%Y-%m-%d")
    out = args.out or Path(__file__).parent / "results" / f"control_rates-{day}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {"date": day, "host_cpus": os.cpu_count(), "load_avg_start": load,
           "load_avg_end": os.getloadavg(), "seconds": time.time() - started}  # fmt: skip
    out.write_text(json.dumps({"benchmark": "control_rates", "environment": env,
                               "noise": "Noise.rough(), RunOrder.BLOCKS", "rows": rows},
                              indent=1) + "\n")  # fmt: skip
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
