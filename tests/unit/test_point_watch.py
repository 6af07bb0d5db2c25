"""A Point's load stops soon after a server of its deployment dies, not at its requests'
timeouts (a killed API server whose engine core still holds its socket leaves requests
hanging): ``until_a_server_dies`` polls the task's processes while the load runs and
gives the turns in flight a short grace to end by themselves."""

from __future__ import annotations

import asyncio

import pytest

from jobs.run import point
from jobs.run.point import ServerDied, until_a_server_dies

pytestmark = pytest.mark.unit


def test_the_load_is_cancelled_and_the_dead_server_named(monkeypatch):
    monkeypatch.setattr(point, "DEAD_POLL_S", 0.01)
    monkeypatch.setattr(point, "DEAD_GRACE_S", 0.05)
    polls: list[int] = []
    cancelled = asyncio.Event()

    async def load():
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def dead() -> list[str]:
        polls.append(1)
        return ["decode0"] if len(polls) >= 3 else []

    async def go():
        with pytest.raises(ServerDied, match="the load stopped: decode0 died"):
            await until_a_server_dies(load(), dead)
        assert cancelled.is_set()

    asyncio.run(asyncio.wait_for(go(), 10))
    assert len(polls) == 3


def test_turns_still_in_flight_may_end_within_the_grace(monkeypatch):
    """P died while turns decode on D: they end within the grace, and the load with them."""
    monkeypatch.setattr(point, "DEAD_POLL_S", 0.01)
    monkeypatch.setattr(point, "DEAD_GRACE_S", 5.0)

    async def load():
        await asyncio.sleep(0.1)
        return ["turn 1 answered"]

    assert asyncio.run(until_a_server_dies(load(), lambda: ["prefill0"])) == ["turn 1 answered"]


def test_a_load_that_ends_returns_its_result_and_its_error():
    async def load():
        return [1, 2]

    async def fails():
        raise ValueError("nope")

    assert asyncio.run(until_a_server_dies(load(), lambda: [])) == [1, 2]
    with pytest.raises(ValueError, match="nope"):
        asyncio.run(until_a_server_dies(fails(), lambda: []))
