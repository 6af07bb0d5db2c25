"""The table printed at the end of a run: TTFT by turn per flow, and where the KV came from."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.table import Table


def ttft_by_turn(points: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Columns (flows) and rows (turns) of median TTFT in ms, with tokens computed / pulled."""
    cells: dict[tuple[int, str], str] = {}
    flows: list[str] = []
    turns: set[int] = set()
    for p in points:
        key = (
            p["flow"]
            if len(points) == len({q["flow"] for q in points})
            else (f"{p['flow']} h={p['workload'].get('history_tokens', 0)}")
        )
        if key not in flows:
            flows.append(key)
        if p.get("status") != "ok":
            for row in p.get("by_turn", []):
                turns.add(row["turn"])
            cells[(0, key)] = "failed"
            continue
        for row in p["by_turn"]:
            turns.add(row["turn"])
            cells[(row["turn"], key)] = (
                f"{row['ttft_ms_p50']:.0f} ms (computed "
                f"{row['prefill_tokens_computed']:.0f}, pulled {row['tokens_pulled']:.0f})"
            )
    rows = [
        [str(t)] + [cells.get((t, f), cells.get((0, f), "-")) for f in flows] for t in sorted(turns)
    ]
    return flows, rows


def print_run_table(points: list[dict[str, Any]], run_dir: str) -> None:

    console = Console()
    if not points:
        console.print(f"No points recorded in {run_dir}.")
        return
    by_dep: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_dep[p["deployment"]["deployment_id"]].append(p)
    for dep_id, dep_points in by_dep.items():
        flows, rows = ttft_by_turn(dep_points)
        table = Table(title=f"TTFT p50 by turn per flow — {dep_id}")
        table.add_column("turn")
        for f in flows:
            table.add_column(f)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        for p in dep_points:
            s = p["summary"]
            console.print(
                f"  {p['flow']:<12} {p['status']:<6} requests {s['requests']} "
                f"(failed {s['failed_requests']}), TTFT p50 {s['ttft_ms']['p50']:.0f} ms, "
                f"ITL p50 {s['itl_ms']['p50']:.1f} ms "
                f"({s.get('tokens_per_chunk_mean', 0.0):.1f} tokens/chunk), "
                f"TPOT p50 {s.get('tpot_ms', {}).get('p50', 0.0):.1f} ms, "
                f"KV moved {p['transfer']['bytes']:.0f} B"
                + (f"\n    error: {p['error'].splitlines()[0]}" if p.get("error") else "")
            )
            for flag in p.get("flags", []):
                console.print(f"    [yellow]flag:[/yellow] {flag}")
    console.print(f"Results: {run_dir}  (python -m analysis {run_dir})")
