"""How the crossover search does against the former fixed grid, on planted crossovers.

A synthetic deployment (``tests/unit/test_crossover_search.py``'s truth and noise: 8% of
TTFT per block's paired saving, 3% of blocks stalled by +-3 SDs more) answers every block.
For crossovers planted at 20, 120, 2,000 and 20,000 tokens it runs, over many seeds:

- the search (``pdbench.plan.crossover_search``, default settings, usable range 0-100,000
  tokens), to its end;
- the former preset's grid (9 lengths 0-4,096 x 15 repetitions, 270 Points) read by the
  same reading (the analysis's curve and verdict on the blocks: ``jobs.run.search_judge``);

and prints, for each, how often the 95% interval holds the planted crossover, the median
Points measured and the median interval width relative to the crossover; where the grid
finds the crossover, also the search run to the grid's own median width (its target), to
compare the Points each needs for the same width.

    .venv/bin/python -m benchmarks.crossover_search [--seeds 100]

Saves ``benchmarks/results/crossover_search-<date>.json`` (or ``--out PATH``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
from pathlib import Path

from pdbench.config.schema import SearchConfig
from pdbench.plan import crossover_search as cs
from testbed.crossover_sim import MAX_TOKENS, judged, measure, planted, search

CASES = ((20, 3.3e-4), (120, 3.3e-4), (2_000, 2e-5), (20_000, 2e-5))
GRID = (0, 32, 64, 128, 256, 512, 1024, 2048, 4096)
GRID_REPETITIONS = 15


def grid_estimate(crossover: int, c1_s: float, seed: int) -> cs.LoadEstimate:
    """The former grid's blocks, read as the search reads its own."""
    dep, rng = planted(crossover, c1_s), random.Random(seed)
    plan = cs.search_plan(SearchConfig(), MAX_TOKENS, [1], 2)
    blocks = [cs.Block(h, 1, r) for h in GRID for r in range(GRID_REPETITIONS)]
    seen = [measure(dep, b, rng) for b in blocks]
    (estimate,) = judged(plan, seen)
    return estimate


def summarize(estimates: list[cs.LoadEstimate], points: list[int], truth: int) -> dict:
    held = [e.low is not None and e.low <= truth <= e.high for e in estimates]
    widths = [w for e in estimates if (w := e.relative_width()) is not None]
    return {
        "covered": sum(held) / len(held),
        "crossing_found": sum(e.shape is cs.SearchShape.CROSSING for e in estimates)
        / len(estimates),
        "median_points": statistics.median(points),
        "median_relative_width": statistics.median(widths) if widths else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    rows = []
    for crossover, c1_s in CASES:
        found = [search(planted(crossover, c1_s), seed) for seed in range(args.seeds)]
        searched = summarize([s.estimates[0] for s, _ in found], [n for _, n in found], crossover)
        grid = [grid_estimate(crossover, c1_s, seed) for seed in range(args.seeds)]
        gridded = summarize(grid, [len(GRID) * GRID_REPETITIONS * 2] * len(grid), crossover)
        row = {"crossover": crossover, "search": searched, "grid": gridded}
        named = [("search", searched), ("grid", gridded)]
        if gridded["median_relative_width"] is not None:
            same = SearchConfig(
                budget_min=60, target_relative_width=gridded["median_relative_width"]
            )
            found = [search(planted(crossover, c1_s), s, same) for s in range(args.seeds)]
            row["search_to_grid_width"] = summarize(
                [s.estimates[0] for s, _ in found], [n for _, n in found], crossover
            )
            named.append(("search to the grid's width", row["search_to_grid_width"]))
        rows.append(row)
        for name, r in named:
            width = r["median_relative_width"]
            print(
                f"planted {crossover:>6,}: {name} holds it in {r['covered']:.0%} of "
                f"{args.seeds} seeds, {r['median_points']:>5.0f} Points, median width "
                + (f"{width:.0%} of it" if width is not None else "none (no crossing found)")
            )
    day = datetime.date.today().isoformat()
    out = Path(args.out or f"benchmarks/results/crossover_search-{day}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seeds": args.seeds, "cases": rows}, indent=1) + "\n")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
