"""What task 0 measures next, asked between Points with the servers up.

The run loop (``jobs.run.loop``) asks a ``NextPoints`` for one Point at a time, giving it the
records measured so far in this run; ``None`` ends the loop. ``PlannedPoints`` hands out the
plan's Points in the launch spec's run order, skipping those recorded ``ok``. Another source
fits the same loop: a search that chooses the next Point from what was measured, or one
that hands out none and waits (the servers stay up until the job is interrupted).
"""

from __future__ import annotations

from typing import Protocol

from pdbench.plan.points import Point
from pdbench.results.store import RunStore
from records.point import PointResult, PointStatus


class NextPoints(Protocol):
    recorded: list[str]  # ids of the Points skipped: recorded ok by an earlier run

    def warm_up_points(self) -> list[Point]:
        """The Points whose (flow, history length) cases the warm-up runs ([]: none)."""
        ...

    def next_point(self, measured: list[PointResult]) -> Point | None:
        """The Point to measure next, knowing this run's records so far; None: done."""
        ...

    def label(self, point: Point) -> str:
        """How the progress lines name ``point``."""
        ...


class PlannedPoints:
    """The plan's Points in the order the launch spec holds (and the dry run printed):
    randomized blocks. A Point recorded ``ok`` is skipped (a resumed or requeued run)."""

    def __init__(self, points: list[Point], run_order: list[str], store: RunStore):
        position = {point_id: i for i, point_id in enumerate(run_order)}
        self.points = sorted(points, key=lambda p: position.get(p.point_id, p.order_index))
        self.store = store
        self.recorded = [p.point_id for p in self.points if self._ok(p)]
        self._next = 0

    def _ok(self, point: Point) -> bool:
        return self.store.point_status(point.point_id) is PointStatus.ok

    def warm_up_points(self) -> list[Point]:
        pending = any(not self._ok(p) for p in self.points)
        return self.points if pending else []

    def next_point(self, measured: list[PointResult]) -> Point | None:
        while self._next < len(self.points):
            point = self.points[self._next]
            self._next += 1
            if not self._ok(point):
                return point
        return None

    def label(self, point: Point) -> str:
        i = self.points.index(point) + 1
        return f"[{i}/{len(self.points)}] {point.flow.value} h={point.history_tokens} " + (
            f"r={point.repetition}"
        )
