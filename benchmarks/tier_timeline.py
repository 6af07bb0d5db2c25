"""Where a test tier's wall time goes: which groups each pytest-xdist worker ran, when.

Reads the lines ``PDBENCH_TEST_TIMELINE=FILE`` makes pytest write (``tests/conftest.py``:
one per test, its worker, xdist group, start and end) and prints, per worker, its groups in
the order it ran them (start and end in minutes from the tier's first test, busy seconds),
the time it sat with nothing to run at the tier's end, and the slowest tests; ``--plot
PNG`` draws the same as one bar per group on a lane per worker; ``--against EARLIER``
compares the tests both timelines ran (another commit's, the same tests: did they slow?).

Run from the repository root::

    PDBENCH_TEST_TIMELINE=/tmp/e2e.jsonl make test
    python -m benchmarks.tier_timeline /tmp/e2e.jsonl --under tests/e2e/ --plot /tmp/e2e.png
    python -m benchmarks.tier_timeline /tmp/now.jsonl --against /tmp/before.jsonl
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Span:
    worker: str
    test: str
    group: str
    start: float
    end: float


@dataclass(frozen=True)
class GroupSpan:
    """The tests of one group one worker ran back to back."""

    worker: str
    group: str
    start: float
    end: float
    busy_s: float
    tests: int


def read_spans(path: Path, under: str = "") -> list[Span]:
    """The tests in ``path`` whose node id starts with ``under`` (``tests/e2e/``: one tier)."""
    spans = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            test = row["test"]
            if not test.startswith(under):
                continue
            group = row["group"] or test.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
            spans.append(Span(row["worker"], test, group, row["start"], row["end"]))
    return sorted(spans, key=lambda span: span.start)


def group_spans(spans: list[Span]) -> list[GroupSpan]:
    """Each worker's consecutive tests of one group as one span."""
    out: list[GroupSpan] = []
    for worker in sorted({span.worker for span in spans}):
        run: list[Span] = []
        for span in [s for s in spans if s.worker == worker] + [None]:
            if run and (span is None or span.group != run[0].group):
                busy = sum(s.end - s.start for s in run)
                out.append(
                    GroupSpan(worker, run[0].group, run[0].start, run[-1].end, busy, len(run))
                )
                run = []
            if span is not None:
                run.append(span)
    return out


def report(spans: list[Span], slowest: int = 15) -> str:
    t0 = min(span.start for span in spans)
    t1 = max(span.end for span in spans)
    lines = [f"tier: {(t1 - t0) / 60:.1f} min, {len(spans)} tests"]
    groups = group_spans(spans)
    for worker in sorted({g.worker for g in groups}):
        mine = [g for g in groups if g.worker == worker]
        busy = sum(g.busy_s for g in mine)
        idle_end = t1 - mine[-1].end
        lines.append(
            f"\n{worker}: busy {busy / 60:.1f} min, done {idle_end / 60:.1f} min before the end"
        )
        for g in mine:
            lines.append(
                f"  {(g.start - t0) / 60:5.1f}-{(g.end - t0) / 60:5.1f} min"
                f"  {g.busy_s:6.0f} s  {g.tests:3d} tests  {g.group}"
            )
    lines.append(f"\nslowest {slowest} tests (setup, call and teardown):")
    for span in sorted(spans, key=lambda s: s.start - s.end)[:slowest]:
        lines.append(f"  {span.end - span.start:6.0f} s  {span.worker}  {span.test}")
    return "\n".join(lines)


def compare(spans: list[Span], before: list[Span], top: int = 10) -> str:
    """This timeline against an earlier one: the tests both ran (their summed seconds in
    each, per file, largest change first) and the seconds of the tests only one ran."""
    now = {s.test: s.end - s.start for s in spans}
    then = {s.test: s.end - s.start for s in before}
    both = sorted(now.keys() & then.keys())
    files: dict[str, list[float]] = {}
    for test in both:
        pair = files.setdefault(test.split("::", 1)[0], [0.0, 0.0])
        pair[0] += then[test]
        pair[1] += now[test]
    only_now, only_then = now.keys() - then.keys(), then.keys() - now.keys()
    lines = [
        f"{len(both)} tests in both: {sum(then[t] for t in both) / 60:.1f} min before, "
        f"{sum(now[t] for t in both) / 60:.1f} min now (worker time)",
        f"only now: {len(only_now)} tests, {sum(now[t] for t in only_now) / 60:.1f} min; "
        f"only before: {len(only_then)} tests, {sum(then[t] for t in only_then) / 60:.1f} min",
    ]
    for name, (a, b) in sorted(files.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))[:top]:
        lines.append(f"  {a:6.0f} s -> {b:6.0f} s  {name}")
    return "\n".join(lines)


def plot(spans: list[Span], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(span.start for span in spans)
    room = 0.05 * (max(span.end for span in spans) - t0) / 60  # a bar wide enough for a name
    groups = group_spans(spans)
    workers = sorted({g.worker for g in groups})
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.8 * len(workers)))
    for lane, worker in enumerate(workers):
        for g in (g for g in groups if g.worker == worker):
            start, width = (g.start - t0) / 60, (g.end - g.start) / 60
            ax.barh(lane, width, left=start, edgecolor="white")
            if width > room:
                name = g.group.removeprefix("test_")
                ax.text(start + width / 2, lane, name, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(workers)), workers)
    ax.set_xlabel("minutes from the tier's first test")
    ax.set_title("test groups per worker")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("timeline", type=Path, help="the PDBENCH_TEST_TIMELINE file")
    parser.add_argument("--plot", type=Path, help="also draw it into this PNG")
    parser.add_argument("--under", default="", help="only tests under this path (tests/e2e/)")
    parser.add_argument("--slowest", type=int, default=15)
    parser.add_argument(
        "--against", type=Path, help="an earlier timeline: the tests both ran, compared"
    )
    args = parser.parse_args(argv)
    spans = read_spans(args.timeline, args.under)
    if not spans:
        parser.error(f"{args.timeline} holds no test")
    print(report(spans, args.slowest))
    if args.against:
        print(f"\nagainst {args.against}:")
        print(compare(spans, read_spans(args.against, args.under)))
    if args.plot:
        plot(spans, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
