"""The rule a ``policy.json`` entry states, applied to one turn (pure).

A turn whose prompt extends ``h`` tokens that D holds (within its lease) can pull them or
have P recompute them. With a cost model in the entry (``pull_cost`` and ``recompute_rate``)
the rule is the load-aware one the analysis fitted: pull when

    t0_ms(load) + h * beta_ms_per_token(load)  <  h * ms_per_token(load)

where ``ms_per_token = 1000 / tokens_per_s`` is P's recompute cost per history token, its
queue included. Each quantity is known at the loads measured; between two of them it is
interpolated linearly in the load (the recompute cost per token, not the rate: a queue adds
to each token's cost roughly in proportion to the requests ahead), and outside them it is
held at the nearest measured load (``clamped``: the rule never extrapolates). A pull's own
cost at a load is that load's fit (``thresholds[].pull_cost``) where the analysis had one,
else the fit over every load (``pull_cost``).

An entry without a cost model uses its thresholds: pull when ``h`` reaches the threshold of
the load band in flight; a band decided with no threshold (recompute was faster at every
length measured) never pulls; a band left undetermined borrows the nearest decided band's.
An entry with neither has no rule (``PullRule.problem``).

The static rules it is checked against (``StaticRule``) hold one band's threshold at every
load, as a deployment that sets vLLM's ``kv_recompute_threshold`` once does.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from pdbench.results.policy_file import DeploymentPolicy, ThresholdBand

COST = "cost"
THRESHOLD = "threshold"


@dataclass(frozen=True)
class LoadCosts:
    """The rule's inputs at one measured load."""

    load: float
    t0_ms: float
    beta_ms_per_token: float
    ms_per_token: float


@dataclass(frozen=True)
class PullDecision:
    """What the rule said for one turn, and why (the router records it with the turn)."""

    pull: bool
    rule: str  # COST | THRESHOLD | STATIC_LIGHT | STATIC_HEAVY
    history_tokens: int
    load: int  # requests in flight at the turn's P, this one included
    pull_ms: float | None = None  # COST: the predicted cost of a pull on P, beyond compute
    recompute_ms: float | None = None  # COST: the predicted cost of recomputing the history
    threshold: int | None = None  # THRESHOLD: the band's (None: never pull)
    clamped: bool = False  # the load lies outside the measured ones: the nearest was used

    def record(self) -> dict:
        return {
            "rule": self.rule,
            "pull": self.pull,
            "history_tokens": self.history_tokens,
            "load": self.load,
            "pull_ms": self.pull_ms,
            "recompute_ms": self.recompute_ms,
            "threshold": self.threshold,
            "clamped": self.clamped,
        }


def _value(x) -> float | None:
    return None if x is None or x.value is None else float(x.value)


def load_costs(entry: DeploymentPolicy) -> list[LoadCosts]:
    """The cost model at each measured load, ascending ([]: the entry has none)."""
    bands = {t.concurrency: t for t in entry.thresholds}
    out = []
    for rate in entry.recompute_rate:
        tokens_per_s = _value(rate.tokens_per_s)
        if tokens_per_s is None or tokens_per_s <= 0:
            continue
        band = bands.get(rate.concurrency)
        cost = band.pull_cost if band is not None and band.pull_cost is not None else None
        cost = cost or entry.pull_cost
        if cost is None:
            continue
        t0, beta = _value(cost.t0_ms), _value(cost.beta_ms_per_token)
        if t0 is None or beta is None:
            continue
        load = float(rate.concurrency) if rate.concurrency is not None else 1.0
        out.append(LoadCosts(load, t0, beta, 1000.0 / tokens_per_s))
    out.sort(key=lambda c: c.load)
    return out


def interpolate(costs: list[LoadCosts], load: float) -> tuple[LoadCosts, bool]:
    """The cost model at ``load`` (linear between measured loads, the nearest outside them)
    and whether it was clamped."""
    if load <= costs[0].load:
        return costs[0], load < costs[0].load
    if load >= costs[-1].load:
        return costs[-1], load > costs[-1].load
    i = bisect.bisect_right([c.load for c in costs], load)
    a, b = costs[i - 1], costs[i]
    w = (load - a.load) / (b.load - a.load)

    def mix(x: float, y: float) -> float:
        return x + w * (y - x)

    return (
        LoadCosts(
            load,
            mix(a.t0_ms, b.t0_ms),
            mix(a.beta_ms_per_token, b.beta_ms_per_token),
            mix(a.ms_per_token, b.ms_per_token),
        ),
        False,
    )


def _decided(band: ThresholdBand) -> bool:
    return band.kv_recompute_threshold is not None or band.status == "decided"


class PullRule:
    """One policy entry as a per-turn decision: ``decide(history_tokens, load)``."""

    def __init__(self, entry: DeploymentPolicy):
        self.entry = entry
        self.costs = load_costs(entry)
        self.bands = [t for t in entry.thresholds if _decided(t)]

    @property
    def kind(self) -> str:
        return COST if self.costs else THRESHOLD

    @property
    def problem(self) -> str:
        """Why the entry cannot decide a turn ("" when it can)."""
        if self.costs or self.bands:
            return ""
        return (
            "it has no cost model (pull_cost with recompute_rate) and no decided threshold "
            "(every band inconclusive or undetermined): measure the crossover until one is "
            "decided, or use flow=pull / flow=recompute"
        )

    def decide(self, history_tokens: int, load: int) -> PullDecision:
        load = max(1, int(load))
        if self.costs:
            at, clamped = interpolate(self.costs, load)
            pull_ms = at.t0_ms + history_tokens * at.beta_ms_per_token
            recompute_ms = history_tokens * at.ms_per_token
            return PullDecision(
                pull=pull_ms < recompute_ms,
                rule=COST,
                history_tokens=history_tokens,
                load=load,
                pull_ms=round(pull_ms, 3),
                recompute_ms=round(recompute_ms, 3),
                clamped=clamped,
            )
        band, clamped = self._band(load)
        threshold = band.kv_recompute_threshold
        return PullDecision(
            pull=threshold is not None and history_tokens >= threshold,
            rule=THRESHOLD,
            history_tokens=history_tokens,
            load=load,
            threshold=threshold,
            clamped=clamped,
        )

    def _band(self, load: int) -> tuple[ThresholdBand, bool]:
        """The decided band of ``load`` or, where that band is undetermined, the decided band
        measured nearest to it (clamped)."""
        own = self.entry.band(load)
        if own is not None and _decided(own):
            return own, False
        if not self.bands:
            raise ValueError(f"policy {self.entry.label}: {self.problem}")

        def distance(b: ThresholdBand) -> float:
            return abs((b.concurrency or 1) - load)

        return min(self.bands, key=distance), True


STATIC_LIGHT = "static_light"
STATIC_HEAVY = "static_heavy"


class StaticRule:
    """One band's threshold at every load: the static rule a deployment runs when it sets
    vLLM's ``kv_recompute_threshold`` once (``STATIC_LIGHT``: the lightest measured load's
    band, ``STATIC_HEAVY``: the heaviest's; a band left undetermined gives way to the nearest
    decided one). P's own threshold compares the tokens it would pull beyond its own prefix
    cache; the router's, the tokens D holds: the same where P holds none of the history."""

    def __init__(self, entry: DeploymentPolicy, which: str):
        if which not in (STATIC_LIGHT, STATIC_HEAVY):
            raise ValueError(f"static rule {which!r}: use {STATIC_LIGHT} or {STATIC_HEAVY}")
        self.entry = entry
        self.kind = which
        bands = sorted(
            (t for t in entry.thresholds if _decided(t)), key=lambda t: t.concurrency or 0
        )
        self.band = (bands[0] if which == STATIC_LIGHT else bands[-1]) if bands else None

    @property
    def problem(self) -> str:
        if self.band is not None:
            return ""
        return (
            "it has no decided threshold (every band inconclusive or undetermined): measure "
            "the crossover until one is decided"
        )

    @property
    def threshold(self) -> int | None:
        return self.band.kv_recompute_threshold if self.band is not None else None

    def decide(self, history_tokens: int, load: int) -> PullDecision:
        if self.band is None:
            raise ValueError(f"policy {self.entry.label}: {self.problem}")
        threshold = self.band.kv_recompute_threshold
        return PullDecision(
            pull=threshold is not None and history_tokens >= threshold,
            rule=self.kind,
            history_tokens=history_tokens,
            load=max(1, int(load)),
            threshold=threshold,
        )


def rules_of(entry: DeploymentPolicy) -> dict[str, PullRule | StaticRule]:
    """Every rule an entry states, by the flow that applies it."""
    return {
        "policy": PullRule(entry),
        STATIC_LIGHT: StaticRule(entry, STATIC_LIGHT),
        STATIC_HEAVY: StaticRule(entry, STATIC_HEAVY),
    }
