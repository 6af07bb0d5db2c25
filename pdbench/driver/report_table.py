"""The table printed at the end of a run: TTFT by turn per flow, and where the KV came from."""

from __future__ import annotations

import statistics
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from records.point import PointResult, PointStatus, TurnRow


def ttft_by_turn(points: list[PointResult]) -> tuple[list[str], list[list[str]]]:
    """Columns (flows, by history length where several) and rows (turns) of median TTFT in
    ms, with tokens computed / pulled; over repetitions, the median of their medians."""
    cells: dict[tuple[int, str], list[TurnRow]] = defaultdict(list)
    failed: set[str] = set()
    flows: list[str] = []
    turns: set[int] = set()
    histories = {p.workload_view.history_tokens for p in points}
    for p in points:
        h = p.workload_view.history_tokens
        key = p.flow if len(histories) == 1 else f"{p.flow} h={h}"
        if key not in flows:
            flows.append(key)
        for row in p.by_turn:
            turns.add(row.turn)
            if p.status == PointStatus.ok:
                cells[(row.turn, key)].append(row)
        if p.status != PointStatus.ok:
            failed.add(key)

    def cell(turn: int, key: str) -> str:
        rows = cells.get((turn, key))
        if not rows:
            return "failed" if key in failed else "-"
        reps = f", {len(rows)} reps" if len(rows) > 1 else ""
        return (
            f"{statistics.median(r.ttft_ms_p50 for r in rows):.0f} ms (computed "
            f"{statistics.median(r.prefill_tokens_computed for r in rows):.0f}, pulled "
            f"{statistics.median(r.tokens_pulled for r in rows):.0f}{reps})"
        )

    order = {p.flow: i for i, p in reversed(list(enumerate(points)))}

    def position(key: str) -> tuple[int, int]:
        flow, _, h = key.partition(" h=")
        return order[flow], int(h or 0)

    flows.sort(key=position)
    rows = [[str(t)] + [cell(t, f) for f in flows] for t in sorted(turns)]
    return flows, rows


def print_run_table(points: list[PointResult], run_dir: str) -> None:

    console = Console()
    if not points:
        console.print(f"No points recorded in {run_dir}.")
        return
    by_dep: dict[str, list[PointResult]] = defaultdict(list)
    for p in points:
        by_dep[p.deployment_view.deployment_id].append(p)
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
            s = p.summary
            console.print(
                f"  {p.flow:<12} {str(p.status):<6} requests {s.requests} "
                f"(failed {s.failed_requests}), TTFT p50 {s.ttft_ms.p50:.0f} ms, "
                f"ITL p50 {s.itl_ms.p50:.1f} ms "
                f"({s.tokens_per_chunk_mean:.1f} tokens/chunk), "
                f"TPOT p50 {s.tpot_ms.p50:.1f} ms, "
                f"KV moved {p.transfer.bytes:.0f} B"
                + (f"\n    error: {p.error.splitlines()[0]}" if p.error.strip() else "")
            )
            for flag in p.flags:
                console.print(f"    [yellow]flag:[/yellow] {flag}")
    console.print(f"Results: {run_dir}  (python -m analysis {run_dir})")
