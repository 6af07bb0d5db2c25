"""When each turn is offered under open-loop arrivals (pure, seeded).

``workload.arrival``: ``waves`` (closed loop: every conversation's turn t, then t+1, with at
most ``concurrency`` in flight; ``request_rate`` > 0 spaces a wave's starts) or an open loop
where turns arrive whether or not earlier ones are answered: ``poisson`` (exponential gaps
at ``request_rate`` turns/s) or ``gamma`` (gamma gaps of the same mean with coefficient of
variation ``burstiness``: above 1, bursts and lulls; 1 is Poisson).

The arrival times are drawn once per Point from its workload seed, so every flow measured on
the same conversations is offered the same sequence. Slots go to turns in wave order (every
conversation's turn 1 in order, then every turn 2, ...): a conversation's turns keep their
order and come about ``conversations / request_rate`` apart. A turn whose previous turn is
not answered by its slot is sent when it is, and counted late: offered and achieved rates
(``offered_load``) say whether the deployment kept up.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

WAVES = "waves"
POISSON = "poisson"
GAMMA = "gamma"
OPEN = (POISSON, GAMMA)
LATE_SHARE_FLAG = 0.1  # more turns sent late than this: the deployment did not keep up
# A turn counts late past this much after its slot: the client's own timer and loop run up
# to a few ms late on a busy host (p90 1 ms on a 2-vCPU VM); a turn held back by its
# conversation's unanswered previous turn waits a TTFT or more.
LATE_S = 0.01


@dataclass(frozen=True)
class Slot:
    at_s: float  # offered, seconds after the Point's load starts
    conversation: int
    turn: int  # 1-based


def gaps(n: int, rate: float, arrival: str, burstiness: float, seed: int) -> list[float]:
    """``n`` inter-arrival gaps (s) of mean ``1 / rate``."""
    if rate <= 0 or not math.isfinite(rate):
        raise ValueError(f"request_rate={rate}: an open loop needs a finite rate > 0")
    rng = random.Random(seed)
    if arrival == POISSON or burstiness == 1.0:
        return [rng.expovariate(rate) for _ in range(n)]
    if arrival != GAMMA:
        raise ValueError(f"arrival={arrival!r}: use one of {OPEN}")
    shape = 1.0 / (burstiness * burstiness)  # CV of a gamma = 1 / sqrt(shape)
    scale = 1.0 / (rate * shape)
    return [rng.gammavariate(shape, scale) for _ in range(n)]


def schedule(
    turns: list[int], rate: float, arrival: str, burstiness: float, seed: int
) -> list[Slot]:
    """The offered time of every turn of conversations with ``turns[c]`` turns each, in wave
    order; the first turn is offered at 0."""
    last = max(turns, default=0)
    order = [(c, t) for t in range(1, last + 1) for c, n in enumerate(turns) if t <= n]
    if not order:
        return []
    out, at = [], 0.0
    steps = [0.0, *gaps(len(order) - 1, rate, arrival, burstiness, seed)]
    for (c, t), gap in zip(order, steps, strict=True):
        at += gap
        out.append(Slot(at, c, t))
    return out


@dataclass(frozen=True)
class OfferedLoad:
    """What an open-loop Point offered and what the deployment took."""

    offered_rate: float  # turns/s the schedule offered
    achieved_rate: float  # turns answered per second, first offer to last answer
    late_share: float  # turns sent after their slot (the previous turn still unanswered)
    lateness_p90_ms: float

    @property
    def kept_up(self) -> bool:
        """Turns went out at their slots: a turn waits past its slot only while the same
        conversation's previous turn is unanswered, so late turns mean a growing queue."""
        return self.late_share <= LATE_SHARE_FLAG

    def record(self) -> dict:
        return {
            "offered_rate": self.offered_rate,
            "achieved_rate": self.achieved_rate,
            "late_share": self.late_share,
            "lateness_p90_ms": self.lateness_p90_ms,
            "kept_up": self.kept_up,
        }


def offered_load(rate: float, offered_s: list[float], sent_s: list[float], done_s: list[float]):
    """From each turn's offered time, when it was sent and when it was answered (s)."""
    if not offered_s:
        return OfferedLoad(rate, 0.0, 0.0, 0.0)
    late = sorted(max(0.0, s - o) for o, s in zip(offered_s, sent_s, strict=True))
    span = max(done_s) - min(offered_s)
    p90 = late[min(len(late) - 1, int(math.ceil(0.9 * len(late))) - 1)]
    return OfferedLoad(
        offered_rate=rate,
        achieved_rate=len(done_s) / span if span > 0 else 0.0,
        late_share=sum(x > LATE_S for x in late) / len(late),
        lateness_p90_ms=p90 * 1e3,
    )
