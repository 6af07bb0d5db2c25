"""The seed benchmark's table from a ``flows`` run of ``multi_turn_vllm(_small)``: TTFT p50 per
flow, P's prefix caching off and on, overall and by turn, beside the numbers the
bidirectional-pull change reported (vLLM's benchmarks/multi_turn client, Llama-3.3-70B,
prefix caching off on P: TTFT p50 219.6 ms pulled, 958.6 ms recomputed).

Each cell is the median over the repetitions of each repetition's p50 (all its requests of
that turn, or of every turn), with the lowest and highest repetition in brackets; the
routes the turns took are counted (a pull turn may have been recomputed: an expired lease,
a diverged history). Run from the repository root::

    python -m benchmarks.seed_table results/flows-...            # markdown on stdout
    python -m benchmarks.seed_table results/flows-... --out t.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

SEED = {"pull": 219.6, "recompute": 958.6}  # TTFT p50 (ms), prefix caching off on P
FLOW_ORDER = ("agg", "recompute", "pull", "decode_first")


def load(run_dir: Path) -> list[dict[str, Any]]:
    """Every ok Point with its requests."""
    out = []
    for path in sorted((run_dir / "points").glob("*.json")):
        point = json.loads(path.read_text())
        if point.get("status") != "ok":
            continue
        lines = (run_dir / point["requests_file"]).read_text().splitlines()
        point["requests"] = [json.loads(line) for line in lines if line.strip()]
        out.append(point)
    return out


def cell(values: list[float]) -> dict[str, float]:
    """Median over repetitions of their p50, and the range."""
    return {"p50_ms": statistics.median(values), "low_ms": min(values), "high_ms": max(values)}


def table(points: list[dict[str, Any]]) -> dict[str, Any]:
    """caching -> flow -> {"all": cell, "by_turn": {turn: cell}, "routes": {...}}."""
    reps: dict[tuple[bool, str, Any], list[float]] = defaultdict(list)
    routes: dict[tuple[bool, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for p in points:
        caching = bool(p["deployment"].get("server", {}).get("prefill_prefix_caching", False))
        flow = p["flow"]
        ok = [r for r in p["requests"] if r["status"] == "ok"]
        reps[(caching, flow, "all")].append(statistics.median(r["ttft_ms"] for r in ok))
        for turn in sorted({r["turn"] for r in ok}):
            ttfts = [r["ttft_ms"] for r in ok if r["turn"] == turn]
            reps[(caching, flow, turn)].append(statistics.median(ttfts))
        for r in ok:
            if r["turn"] > 1:
                routes[(caching, flow)][r["path"] or "?"] += 1
    out: dict[str, Any] = {}
    for (caching, flow, turn), values in reps.items():
        entry = out.setdefault("on" if caching else "off", {}).setdefault(
            flow, {"by_turn": {}, "routes": dict(routes[(caching, flow)])}
        )
        if turn == "all":
            entry["all"] = cell(values)
        else:
            entry["by_turn"][turn] = cell(values)
    return out


def fmt(c: dict[str, float] | None) -> str:
    if not c:
        return "-"
    return f"{c['p50_ms']:,.0f} [{c['low_ms']:,.0f}, {c['high_ms']:,.0f}]"


def markdown(result: dict[str, Any]) -> str:
    lines = []
    for caching in ("off", "on"):
        flows = result.get(caching)
        if not flows:
            continue
        names = [f for f in FLOW_ORDER if f in flows]
        turns = sorted({int(t) for f in names for t in flows[f]["by_turn"]})
        lines.append(f"P's prefix caching {caching}: TTFT p50 (ms) [lowest, highest repetition]")
        lines.append("")
        lines.append("| turn | " + " | ".join(names) + " |")
        lines.append("| --- |" + " --- |" * len(names))
        for t in turns:
            row = [
                fmt(flows[f]["by_turn"].get(t) or flows[f]["by_turn"].get(str(t))) for f in names
            ]
            lines.append(f"| {t} | " + " | ".join(row) + " |")
        lines.append("| all | " + " | ".join(fmt(flows[f].get("all")) for f in names) + " |")
        routes = "; ".join(
            f"{f}: " + ", ".join(f"{k} {v}" for k, v in sorted(flows[f]["routes"].items()))
            for f in names
            if flows[f]["routes"]
        )
        lines += ["", f"routes of turns >= 2: {routes}", ""]
    seed = ", ".join(f"{k} {v} ms" for k, v in SEED.items())
    lines.append(f"seed (Llama-3.3-70B, prefix caching off on P): TTFT p50 {seed}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    result = table(load(args.run_dir))
    if not result:
        raise SystemExit(f"{args.run_dir}: no ok Point")
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps({"seed_ms": SEED, "measured": result}, indent=1))


if __name__ == "__main__":
    main()
