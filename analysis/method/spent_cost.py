"""What P spends on a turn, fitted, and the crossover it predicts (pure numpy and pandas).

From each request's TTFT split (``ttft_split``), turns >= 2 at one load, P's spend ``S`` is
its queue, compute and pull parts (``p_queue_ms + p_compute_ms + p_pull_ms``) at ``h``
history tokens:

- recompute: ``S(h) = r0 + r1 h (+ r2 h^2)``: P queues and prefills the history and the
  new tokens; ``r2`` is attention's share (fitted with three or more lengths, kept only when
  > 0); P's recompute rate at that load, ``R_eff = 1 / (r1 + r2 h_ref)`` tokens/s, is the
  history recomputed per second at ``h_ref``: the predicted crossover (the longest measured
  length when there is none), so that ``h / R_eff`` is the recompute cost there;
- pull (turns the router pulled): ``S(h) = p0 + beta h``: P queues, pulls the history and
  prefills the new tokens against it;
- a pull costs P, beyond what a recompute spends anyway, a fixed ``t0 = p0 - r0`` and
  ``beta`` per token, so pulling pays where ``t0 + beta h < r1 h + r2 h^2`` (a load-aware
  router's rule ``t0 + beta h < h / R_eff``): the predicted crossover is its root.

Fits: weighted least squares on wave means (a turn of a repetition), weights ``1 / level^2``
(``level``: the mean at that length, flow and turn), as ``saving_curve`` weighs. Intervals:
``stats.bootstrap_interval`` over the repetitions (Rao-Wu, strata: the history lengths),
Student-t with Satterthwaite df; the crossover's on a log scale (a positive ratio), a
replicate without a root counting as 1 token (pull pays everywhere) or ``MAX_TOKENS``.
Parts of the TTFT outside P (router, hand-off, D's first step) are taken as common to both
flows: where they are not, the prediction misses, and ``check`` says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.method.predict import MAX_TOKENS
from analysis.method.saving_curve import Crossover, Shape
from analysis.method.stats import Spread, Status, bootstrap_interval
from pdbench.results.interval import Interval

P_PARTS = ("p_queue_ms", "p_compute_ms", "p_pull_ms")
COLUMNS = ["kind", "h", "repetition", "turn", "flow", "x", "spent_ms"]
STRATUM = ["kind", "h"]
CLUSTER = [*STRATUM, "repetition"]


@dataclass(frozen=True)
class SpentCosts:
    """P's spent costs at one load (``concurrency`` None: the only one, or pooled) and the
    crossover they predict. Times in ms, ``tokens_per_s`` R_eff."""

    concurrency: int | None
    shape: Shape  # CROSSING, PULL_EVERYWHERE, RECOMPUTE_EVERYWHERE, NO_DATA
    crossover: Interval  # predicted tokens (value None unless CROSSING)
    t0_ms: Interval
    beta_ms_per_token: Interval
    recompute_ms_per_token: Interval  # r1
    recompute_ms_per_token2: float  # r2 (0: linear)
    tokens_per_s: Interval  # R_eff = 1000 / (r1 + r2 h_ref), module docstring
    repetitions: int = 0
    requests: int = 0
    reason: str = ""  # why there is no prediction

    def describe(self) -> str:
        if self.shape is Shape.NO_DATA:
            return f"n/a ({self.reason or 'no TTFT split'})"
        if self.shape is Shape.PULL_EVERYWHERE:
            return "none: pull pays from the first token"
        if self.shape is Shape.RECOMPUTE_EVERYWHERE:
            return f"none: recompute cheaper up to {MAX_TOKENS:,} tokens"
        c = self.crossover
        if c.low is None and c.high is None:
            return f"{c.value:,.0f} tokens (no interval)"
        return f"{c.value:,.0f} tokens, 95% CI {c.text()[len(f'{c.value:,.0f} ') :]}"

    def costs_text(self) -> str:
        """``t0 12.0 ms [9.1, 15.0], beta 0.0040 ms/token [...], R_eff 2,100 tok/s [...]``."""
        return (
            f"t0 {self.t0_ms.text('{:,.1f}')} ms, beta {self.beta_ms_per_token.text('{:,.4f}')} "
            f"ms/token, R_eff {self.tokens_per_s.text()} tok/s"
        )

    def to_dict(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "shape": self.shape.value,
            "crossover_tokens": self.crossover.to_dict(),
            "t0_ms": self.t0_ms.to_dict(),
            "beta_ms_per_token": self.beta_ms_per_token.to_dict(),
            "recompute_ms_per_token": self.recompute_ms_per_token.to_dict(),
            "recompute_ms_per_token2": self.recompute_ms_per_token2,
            "tokens_per_s": self.tokens_per_s.to_dict(),
            "repetitions": self.repetitions,
            "requests": self.requests,
            "reason": self.reason,
            "text": self.describe(),
        }


def none(concurrency: int | None, reason: str) -> SpentCosts:
    empty = Interval(None)
    return SpentCosts(concurrency, Shape.NO_DATA, empty, empty, empty, empty, 0.0, empty,
                      reason=reason)  # fmt: skip


def spent_frame(requests: pd.DataFrame, point_ids: set[str], pull_flow: str = "pull"):
    """P's spend per ok request of turn >= 2 of these Points, recompute and pulled turns of
    ``pull_flow`` (renamed ``pull``), in ``COLUMNS``; requests without a split left out."""
    parts = [f"split_{p}" for p in P_PARTS]
    if not len(requests) or not any(c in requests for c in parts):
        return pd.DataFrame(columns=COLUMNS)
    r = requests[requests["point_id"].isin(point_ids) & (requests["turn"] >= 2)]
    r = r[r["flow"].isin(["recompute", pull_flow])]
    if "status" in r:
        r = r[r["status"] == "ok"]
    if "path" in r:  # a pull-flow turn the router recomputed (threshold, lease, edit)
        recomputed = r["path"].fillna("").astype(str).str.startswith("recompute")
        r = r[(r["flow"] == "recompute") | ~recomputed]
    split = r[[c for c in parts if c in r]].astype(float)
    have = split.notna().any(axis=1).to_numpy()
    out = pd.DataFrame(
        {
            "kind": r["kind"].fillna("").astype(str),
            "h": r["point_history_tokens"].astype(int),
            "repetition": r["repetition"].astype(int),
            "turn": r["turn"].astype(int),
            "flow": np.where(r["flow"] == "recompute", "recompute", "pull"),
            "x": r["history_tokens"].astype(float),
            "spent_ms": split.fillna(0.0).sum(axis=1),
        }
    )
    return out[have].reset_index(drop=True)


@dataclass(frozen=True)
class _Design:
    """One flow's per-cluster normal equations: ``M[g] = sum w d d^T``, ``v[g] = sum w d y``."""

    m: np.ndarray  # (G, K, K)
    v: np.ndarray  # (G, K)

    def coef(self, weights: np.ndarray) -> np.ndarray:
        """(B, G) cluster weights -> (B, K) coefficients."""
        a = np.einsum("bg,gij->bij", weights, self.m)
        b = weights @ self.v
        return (np.linalg.pinv(a) @ b[..., None])[..., 0]


def _design(w: pd.DataFrame, clusters: int, degree: int, scale: float) -> _Design:
    u = w["x"].to_numpy(float) / scale
    d = np.column_stack([u**k for k in range(degree + 1)])
    wt = w["weight"].to_numpy(float)
    y = w["spent_ms"].to_numpy(float)
    g = w["cluster"].to_numpy(int)
    m = np.zeros((clusters, degree + 1, degree + 1))
    v = np.zeros((clusters, degree + 1))
    np.add.at(m, g, wt[:, None, None] * d[:, :, None] * d[:, None, :])
    np.add.at(v, g, (wt * y)[:, None] * d)
    return _Design(m, v)


def root(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Where ``a h^2 + b h + c`` first turns positive for h > 0 (``c < 0``): the smaller
    positive root, written ``-2c / (b + sqrt(b^2 - 4ac))`` (no cancellation when ``a`` is
    tiny); 0 where ``c >= 0``; inf where it never does."""
    a, b, c = (np.asarray(z, float) for z in (a, b, c))
    disc = b * b - 4.0 * a * c
    sq = np.sqrt(np.where(disc >= 0, disc, 0.0))
    den = b + sq
    ok = (disc >= 0) & (den > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(ok, -2.0 * c / np.where(ok, den, 1.0), np.inf)
    return np.where(c >= 0, 0.0, r)


def _bounds(s: Spread, k: int) -> tuple[float | None, float | None]:
    low, high = s.bounds()
    lo, hi = float(low[k]), float(high[k])
    return (lo if math.isfinite(lo) else None, hi if math.isfinite(hi) else None)


def fit_spent(frame: pd.DataFrame, concurrency: int | None = None, seed: int = 0) -> SpentCosts:
    """P's spent costs and the predicted crossover from ``spent_frame`` rows (module doc)."""
    flows = set(frame["flow"]) if len(frame) else set()
    if flows != {"recompute", "pull"}:
        return none(concurrency, "needs the TTFT split of pulled and recomputed turns >= 2")
    waves = frame.groupby([*CLUSTER, "flow", "turn"], as_index=False)[["x", "spent_ms"]].mean()
    level = waves.groupby([*STRATUM, "flow", "turn"])["spent_ms"].transform("mean")
    waves["weight"] = 1.0 / np.maximum(level.to_numpy(float), 1e-3) ** 2
    waves["cluster"] = waves.groupby(CLUSTER, sort=True).ngroup()
    firsts = waves.drop_duplicates("cluster").sort_values("cluster")
    strata = firsts.groupby(STRATUM, sort=True).ngroup().to_numpy()
    rec, pull = waves[waves["flow"] == "recompute"], waves[waves["flow"] == "pull"]
    lengths = {f: len(np.unique(np.round(w["x"]))) for f, w in (("r", rec), ("p", pull))}
    if min(lengths.values()) < 2:
        return none(concurrency, "fewer than two history lengths in a flow's TTFT split")
    g, scale = len(strata), float(waves["x"].abs().max()) or 1.0
    pd_ = _design(pull, g, 1, scale)
    degree = 2 if lengths["r"] >= 3 else 1
    if degree == 2 and _design(rec, g, 2, scale).coef(np.ones((1, g)))[0, 2] <= 0:
        degree = 1  # attention's share not seen here: the straight line
    rd = _design(rec, g, degree, scale)
    longest = float(rec["x"].max())

    def stat(w: np.ndarray) -> np.ndarray:
        rc, pc = rd.coef(w), pd_.coef(w)
        t0, beta, r1 = pc[:, 0] - rc[:, 0], pc[:, 1] / scale, rc[:, 1] / scale
        r2 = rc[:, 2] / scale**2 if degree == 2 else np.zeros_like(r1)
        h = np.clip(root(r2, r1 - beta, -t0), 1.0, MAX_TOKENS)
        ref = np.where(h < MAX_TOKENS, h, longest)
        return np.column_stack([np.log(h), t0, beta, r1, r1 + r2 * ref])

    spread = bootstrap_interval(stat, strata, seed=seed)
    log_h, t0, beta, r1, secant = (float(v) for v in spread.estimate)
    r2 = float(rd.coef(np.ones((1, g)))[0, 2]) / scale**2 if degree == 2 else 0.0
    exact = float(root(r2, r1 - beta, -t0))
    reps = int(np.bincount(strata).min())
    common = dict(
        t0_ms=Interval(t0, *_bounds(spread, 1)),
        beta_ms_per_token=Interval(beta, *_bounds(spread, 2)),
        recompute_ms_per_token=Interval(r1, *_bounds(spread, 3)),
        recompute_ms_per_token2=r2,
        tokens_per_s=_rate(secant, *_bounds(spread, 4)),
        repetitions=reps,
        requests=len(frame),
    )
    if exact <= 0:
        return SpentCosts(concurrency, Shape.PULL_EVERYWHERE, Interval(None), **common)
    if exact >= MAX_TOKENS:
        return SpentCosts(concurrency, Shape.RECOMPUTE_EVERYWHERE, Interval(None), **common)
    lo, hi = _bounds(spread, 0)
    cross = Interval(
        math.exp(log_h),
        math.exp(lo) if lo is not None else None,
        math.exp(hi) if hi is not None else None,
    )
    return SpentCosts(concurrency, Shape.CROSSING, cross, **common)


def _rate(r1: float, low: float | None, high: float | None) -> Interval:
    """ms per token -> tokens/s (an interval reaching 0 ms is open above)."""
    if not r1 > 0:
        return Interval(None)
    return Interval(
        1e3 / r1,
        1e3 / high if high is not None and high > 0 else None,
        1e3 / low if low is not None and low > 0 else None,
    )


@dataclass(frozen=True)
class Check:
    """The prediction against the measured crossover: ``validated`` when it lies inside the
    measured 95% interval (None: nothing decided to check against)."""

    validated: bool | None
    why: str

    def text(self) -> str:
        if self.validated is None:
            return f"not checked ({self.why})"
        return ("validated" if self.validated else "NOT validated") + f" ({self.why})"

    def to_dict(self) -> dict:
        return {"validated": self.validated, "why": self.why, "text": self.text()}


def check(pred: SpentCosts, measured: Crossover) -> Check:
    if pred.shape is Shape.NO_DATA:
        return Check(None, "no prediction")
    if measured.status is not Status.DECIDED or measured.shape not in (
        Shape.CROSSING,
        Shape.PULL_EVERYWHERE,
        Shape.RECOMPUTE_EVERYWHERE,
    ):
        return Check(None, f"the measured crossover is {measured.status.value}")
    value = {Shape.PULL_EVERYWHERE: 0.0, Shape.RECOMPUTE_EVERYWHERE: math.inf}.get(
        pred.shape, pred.crossover.value
    )
    low = measured.low if measured.low is not None else -math.inf
    high = measured.high if measured.high is not None else math.inf
    shown = f"{value:,.0f} tokens" if pred.shape is Shape.CROSSING else pred.describe()
    inside = low <= value <= high
    where = "inside" if inside else "outside"
    return Check(inside, f"predicted {shown} lies {where} the measured {measured.interval_text()}")
