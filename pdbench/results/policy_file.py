"""``policy.json``: the analysed pull-or-recompute answer, typed, for whoever applies it.

``python -m analysis`` writes it (``analysis/output/policy.py`` builds it from a run's records);
the router's ``flow=policy`` (``jobs.serving.router``), the validation of a launch
(``pdbench.validate``) and ``python -m analysis.whatif`` read it back into these types.
Every time is in ms, every length in tokens, every interval a 95% one as
``{"value", "low", "high"}`` (``low``/``high`` null: open or unknown on that side).

Fields (``SCHEMA_VERSION`` 1)::

    schema_version        1; a reader refuses a newer major version
    run_dirs              the run directories analysed
    deployments[]         one per deployment whose crossover was measured:
      deployment_id       the Points' deployment id
      label               model · transport · TP · placement (as the answer names it)
      model               conf/model name
      transport           conf/transport name (e.g. dram, tcp, rdma, nvlink)
      tp_prefill, tp_decode   the TP pair P tp -> D tp
      topology_class      same_node | cross_node: the nodes the instances ran on (their
                          hosts), or the topology's placement where no hosts were recorded
      topology_source     "nodes" or "placement": where topology_class came from
      block_size          KV block size; thresholds are rounded up to it
      pull_cost           what a pull costs P beyond a recompute, from P's TTFT split over
                          every load (analysis/method/spent_cost.py): t0_ms (fixed part),
                          beta_ms_per_token (per history token pulled)
      recompute_rate[]    per measured concurrency: tokens_per_s (R_eff: history tokens
                          P recomputes per second at that load, its queue included, taken
                          at the predicted crossover, else the longest length measured, so
                          h * 1000 / tokens_per_s is the recompute cost there),
                          ms_per_token2 (attention's h^2 term, 0 when not seen)
      thresholds[]        per load band (ascending concurrency):
        concurrency       the load measured (requests in flight); null: not recorded
        min_concurrency, max_concurrency   the band it stands for: from this level up to
                          the next measured one (exclusive); max null: no upper bound
        kv_recompute_threshold   vLLM's setting for the band: the measured crossover
                          rounded up to block_size (analysis/method/deployment.py advise_threshold);
                          null: do not pull (recompute faster) or not determined (status)
        threshold_interval       its 95% interval, rounded the same way
        crossover         the measured crossover, tokens, with its 95% interval
        shape             crossing | pull_faster_everywhere | recompute_faster_everywhere |
                          pull_faster_below | changes_sign_more_than_once | no_data
        status            decided | inconclusive | undetermined
        predicted         the crossover P's spent costs predict at this load, or null
        validated         whether that prediction lies inside the measured interval (null:
                          not checked)
        pull_cost         t0_ms and beta_ms_per_token fitted at this load only
      measured            which parts are measurements (false: absent, not assumed):
                          crossover, pull_cost, recompute_rate; topology_class's source

How a router applies it: ``pdbench.results.policy_rule``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdbench.results.interval import Interval

SCHEMA_VERSION = 1
FILE_NAME = "policy.json"


@dataclass(frozen=True)
class PullCost:
    t0_ms: Interval
    beta_ms_per_token: Interval

    def to_dict(self) -> dict[str, Any]:
        return {
            "t0_ms": self.t0_ms.to_dict(),
            "beta_ms_per_token": self.beta_ms_per_token.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> PullCost | None:
        if not d:
            return None
        return cls(Interval.from_dict(d["t0_ms"]), Interval.from_dict(d["beta_ms_per_token"]))


@dataclass(frozen=True)
class RecomputeRate:
    concurrency: int | None
    tokens_per_s: Interval
    ms_per_token2: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "tokens_per_s": self.tokens_per_s.to_dict(),
            "ms_per_token2": self.ms_per_token2,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RecomputeRate:
        return cls(d["concurrency"], Interval.from_dict(d["tokens_per_s"]), d["ms_per_token2"])


@dataclass(frozen=True)
class ThresholdBand:
    concurrency: int | None
    min_concurrency: int | None
    max_concurrency: int | None
    kv_recompute_threshold: int | None
    threshold_interval: Interval
    crossover: Interval
    shape: str
    status: str
    predicted: Interval | None = None
    validated: bool | None = None
    pull_cost: PullCost | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "min_concurrency": self.min_concurrency,
            "max_concurrency": self.max_concurrency,
            "kv_recompute_threshold": self.kv_recompute_threshold,
            "threshold_interval": self.threshold_interval.to_dict(),
            "crossover": self.crossover.to_dict(),
            "shape": self.shape,
            "status": self.status,
            "predicted": self.predicted.to_dict() if self.predicted else None,
            "validated": self.validated,
            "pull_cost": self.pull_cost.to_dict() if self.pull_cost else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ThresholdBand:
        return cls(
            d["concurrency"],
            d["min_concurrency"],
            d["max_concurrency"],
            d["kv_recompute_threshold"],
            Interval.from_dict(d["threshold_interval"]),
            Interval.from_dict(d["crossover"]),
            d["shape"],
            d["status"],
            Interval.from_dict(d["predicted"]) if d.get("predicted") else None,
            d.get("validated"),
            PullCost.from_dict(d.get("pull_cost")),
        )


@dataclass(frozen=True)
class PolicyTarget:
    """What a deployment must share with a policy's entry for the entry to apply to it."""

    model: str
    transport: str
    tp_prefill: int
    tp_decode: int
    topology_class: str
    block_size: int

    def describe(self) -> str:
        return (
            f"model={self.model} transport={self.transport} "
            f"TP {self.tp_prefill}->{self.tp_decode} {self.topology_class} "
            f"block_size={self.block_size}"
        )


@dataclass(frozen=True)
class DeploymentPolicy:
    deployment_id: str
    label: str
    model: str
    transport: str
    tp_prefill: int
    tp_decode: int
    topology_class: str
    topology_source: str
    block_size: int
    pull_cost: PullCost | None
    recompute_rate: list[RecomputeRate]
    thresholds: list[ThresholdBand]

    @property
    def measured(self) -> dict[str, Any]:
        return {
            "crossover": any(t.status == "decided" for t in self.thresholds),
            "pull_cost": self.pull_cost is not None,
            "recompute_rate": any(r.tokens_per_s.value is not None for r in self.recompute_rate),
            "topology_class": self.topology_source,
        }

    @property
    def target(self) -> PolicyTarget:
        return PolicyTarget(
            self.model,
            self.transport,
            self.tp_prefill,
            self.tp_decode,
            self.topology_class,
            self.block_size,
        )

    def band(self, concurrency: int) -> ThresholdBand | None:
        """The band a router serving ``concurrency`` requests in flight falls in."""
        for t in self.thresholds:
            lo, hi = t.min_concurrency, t.max_concurrency
            if (lo is None or concurrency >= lo) and (hi is None or concurrency <= hi):
                return t
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "label": self.label,
            "model": self.model,
            "transport": self.transport,
            "tp_prefill": self.tp_prefill,
            "tp_decode": self.tp_decode,
            "topology_class": self.topology_class,
            "topology_source": self.topology_source,
            "block_size": self.block_size,
            "pull_cost": self.pull_cost.to_dict() if self.pull_cost else None,
            "recompute_rate": [r.to_dict() for r in self.recompute_rate],
            "thresholds": [t.to_dict() for t in self.thresholds],
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeploymentPolicy:
        return cls(
            d["deployment_id"],
            d["label"],
            d["model"],
            d["transport"],
            int(d["tp_prefill"]),
            int(d["tp_decode"]),
            d["topology_class"],
            d["topology_source"],
            int(d["block_size"]),
            PullCost.from_dict(d.get("pull_cost")),
            [RecomputeRate.from_dict(r) for r in d.get("recompute_rate") or []],
            [ThresholdBand.from_dict(t) for t in d.get("thresholds") or []],
        )


@dataclass(frozen=True)
class Policy:
    run_dirs: list[str]
    deployments: list[DeploymentPolicy] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_dirs": list(self.run_dirs),
            "deployments": [d.to_dict() for d in self.deployments],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Policy:
        version = int(d.get("schema_version", 0))
        if version < 1 or version > SCHEMA_VERSION:
            raise ValueError(
                f"policy schema_version {version}: this pdbench reads 1..{SCHEMA_VERSION}"
            )
        deps = [DeploymentPolicy.from_dict(x) for x in d.get("deployments") or []]
        return cls(list(d.get("run_dirs") or []), deps, version)


def _finite(value: Any) -> Any:
    """nan/inf -> None and numpy scalars -> Python, recursively (JSON has neither)."""
    if hasattr(value, "item") and not isinstance(value, str | dict | list):
        value = value.item()
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write(path: Path, policy: Policy) -> Path:
    path.write_text(json.dumps(_finite(policy.to_dict()), indent=1) + "\n")
    return path


def read(path: str | Path) -> Policy:
    """A policy.json; ValueError (naming the file) when it is not one this version reads."""
    try:
        return Policy.from_dict(json.loads(Path(path).read_text()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable policy.json ({exc})") from None


def mismatches(entry: DeploymentPolicy, target: PolicyTarget) -> list[str]:
    """``field: policy's value != deployment's`` for each setting that differs."""
    have = entry.target
    return [
        f"{name}: policy {getattr(have, name)} != deployment {getattr(target, name)}"
        for name in PolicyTarget.__dataclass_fields__
        if getattr(have, name) != getattr(target, name)
    ]


def entry_for(policy: Policy, target: PolicyTarget) -> tuple[DeploymentPolicy | None, list[str]]:
    """The policy's entry for a deployment like ``target`` and ``[]``; else the nearest entry
    (fewest differences) and what differs (``(None, [...])`` for a policy with no entry)."""
    if not policy.deployments:
        return None, ["the policy holds no deployment"]
    ranked = sorted(policy.deployments, key=lambda e: len(mismatches(e, target)))
    return ranked[0], mismatches(ranked[0], target)
