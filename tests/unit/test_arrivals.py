"""Open-loop arrivals: the offered rate and burstiness, one seeded sequence for every flow,
each conversation's turns in order, what a Point reports of the load it was offered, and
the settings refused before anything starts."""

from __future__ import annotations

import statistics

import pytest

from pdbench.config.schema import Arrival
from pdbench.plan.arrivals import GAMMA, POISSON, gaps, offered_load, schedule
from pdbench.validate.rules import check_arrivals, check_counts
from tests.unit.helpers import cpu_run

pytestmark = pytest.mark.unit


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


def test_poisson_gaps_have_the_rate_and_a_cv_of_one():
    xs = gaps(20_000, 4.0, POISSON, 1.0, seed=1)
    assert statistics.fmean(xs) == pytest.approx(0.25, rel=0.03)
    assert cv(xs) == pytest.approx(1.0, abs=0.03)


def test_gamma_gaps_keep_the_rate_and_take_the_burstiness():
    xs = gaps(20_000, 4.0, GAMMA, 3.0, seed=1)
    assert statistics.fmean(xs) == pytest.approx(0.25, rel=0.08)
    assert cv(xs) == pytest.approx(3.0, rel=0.1)
    smooth = gaps(20_000, 4.0, GAMMA, 0.5, seed=1)
    assert cv(smooth) == pytest.approx(0.5, rel=0.05)


def test_the_same_seed_offers_the_same_sequence_another_seed_another():
    a = schedule([3, 3, 2], 2.0, POISSON, 1.0, seed=7)
    assert a == schedule([3, 3, 2], 2.0, POISSON, 1.0, seed=7)
    assert a != schedule([3, 3, 2], 2.0, POISSON, 1.0, seed=8)


def test_turns_come_in_wave_order_and_each_conversation_in_its_own_order():
    slots = schedule([3, 1, 2], 5.0, GAMMA, 2.0, seed=3)
    assert [(s.conversation, s.turn) for s in slots] == [
        (0, 1),
        (1, 1),
        (2, 1),
        (0, 2),
        (2, 2),
        (0, 3),
    ]
    times = [s.at_s for s in slots]
    assert times[0] == 0.0 and times == sorted(times)
    assert schedule([], 1.0, POISSON, 1.0, 0) == []


def test_a_point_kept_up_when_its_turns_went_out_at_their_slots():
    offered = [0.0, 0.5, 1.0, 1.5]
    kept = offered_load(2.0, offered, offered, [0.2, 0.7, 1.2, 1.7])
    assert kept.kept_up and kept.late_share == 0.0
    assert kept.achieved_rate == pytest.approx(4 / 1.7)
    late = offered_load(2.0, offered, [0.0, 0.9, 1.8, 2.7], [0.8, 1.7, 2.6, 3.5])
    assert not late.kept_up
    assert late.late_share == pytest.approx(0.75)
    assert late.lateness_p90_ms == pytest.approx(1200.0)
    # the client's own timer a few ms behind is no queue
    jitter = offered_load(2.0, offered, [x + 0.004 for x in offered], [0.2, 0.7, 1.2, 1.7])
    assert jitter.kept_up and jitter.late_share == 0.0 and jitter.lateness_p90_ms > 0
    assert late.record()["kept_up"] is False


def problems(cfg) -> str:
    return "\n".join(str(p) for p in check_arrivals(cfg) + check_counts(cfg))


def test_open_loop_settings_are_bounded():
    cfg = cpu_run()
    cfg.workload.arrival = Arrival.poisson
    assert "must be a rate > 0 with workload.arrival=poisson" in problems(cfg)
    cfg.workload.request_rate = float("nan")
    assert "workload.request_rate=nan" in problems(cfg)
    cfg.workload.request_rate = 0.001  # 16 turns over 4.4 hours
    assert "over 267 min (at most 60 min a Point)" in problems(cfg)
    cfg.workload.request_rate = 2.0
    assert problems(cfg) == ""
    cfg.workload.burstiness = 0.0
    assert "workload.burstiness=0.0: is a CV of the gaps" in problems(cfg)
    waves = cpu_run()
    waves.workload.request_rate = float("inf")
    assert "workload.request_rate=inf: must be a finite non-negative number" in problems(waves)
