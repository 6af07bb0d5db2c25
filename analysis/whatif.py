"""What-if: the pull-vs-recompute crossover of a model on a fabric, from two rates.

    python -m analysis.whatif model=llama3_70b bandwidth_gbps=400 prefill_tok_s=3000

Arguments (key=value):

  model           a name in conf/model/*.yaml or built in (tiny_llama, llama3_8b, llama3_70b)
  bandwidth_gbps  link bandwidth in gigabits/s, as links are sold (400 -> 50 GB/s); or
  bandwidth_gb_s  the same in gigabytes/s (e.g. a transfer-bench plateau)
  prefill_tok_s   prefill throughput of one P instance on short prompts, tokens/s
  alpha_ms        fixed cost of one KV transfer, ms (default 0; the bench fit's alpha)
  new_tokens      tokens computed in either flow each turn (default 64)
  overhead_ms     fixed TTFT cost common to both flows, ms (default 0)
  kv_dtype        KV-cache dtype, if not the model's (e.g. fp8)
  at              history lengths for the speedup table (default 1024,8192,32768)
  policy          a policy.json (``python -m analysis`` wrote it for a measured run): its
                  calibrated fixed cost per pull (t0, what P really spends) becomes alpha and
                  its measured recompute rate (R_eff) prefill_tok_s, unless those are given;
                  model defaults to the policy's
  deployment      with policy: which of its deployments (id, or a part of its label) when
                  it holds several
  concurrency     with policy: the load whose recompute rate to use (its band; default
                  the lowest measured)

Each argument once; numbers finite, rates and lengths > 0, alpha and overhead >= 0 (an
error names the argument; exit status 2).

Model: computing ``h`` history tokens costs their FLOPs (``analysis.method.model_cost``) at
``prefill_tok_s x FLOPs per short-prompt token``; pulling them costs ``alpha + h x KV bytes
per token / bandwidth``. The fixed cost per pull (alpha) is the least measured input (the
transfer fit's intercept, or a guess), so the answer is also shown for alphas around it.
The output says which inputs were measured (from a policy.json), given, or assumed.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace

from analysis.method.model_cost import ModelShape, known_shapes
from analysis.method.predict import first_principles_saving, predicted_crossover
from analysis.method.saving_curve import Shape
from analysis.output import policy as policy_file
from connector.layout import dtype_nbytes

KEYS = (
    "model",
    "bandwidth_gbps",
    "bandwidth_gb_s",
    "prefill_tok_s",
    "alpha_ms",
    "new_tokens",
    "overhead_ms",
    "kv_dtype",
    "at",
    "policy",
    "deployment",
    "concurrency",
)


@dataclass
class WhatIf:
    shape: ModelShape
    bandwidth_bytes_per_s: float
    prefill_tok_s: float
    alpha_s: float = 0.0
    new_tokens: int = 64
    overhead_s: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)  # input -> where it came from

    @property
    def flops_per_s(self) -> float:
        return self.prefill_tok_s * self.shape.flops_per_token(0.0)

    def recompute_s(self, h: float) -> float:
        u = self.new_tokens
        return self.overhead_s + self.shape.prefill_flops(h + u) / self.flops_per_s

    def pull_s(self, h: float) -> float:
        u = self.new_tokens
        compute = self.shape.prefill_flops(u, start=h) / self.flops_per_s
        transfer = self.alpha_s + h * self.shape.kv_bytes_per_token / self.bandwidth_bytes_per_s
        return self.overhead_s + compute + transfer


def _number(
    args: dict[str, str], key: str, default: float | None, minimum: float, strict: bool
) -> float:
    """``args[key]`` as a finite number >= ``minimum`` (> when ``strict``)."""
    if key not in args:
        if default is None:
            raise ValueError(f"give {key}=<number>")
        return default
    try:
        value = float(args[key])
    except ValueError:
        raise ValueError(f"{key}={args[key]!r} is not a number") from None
    bound = "> " if strict else ">= "
    if not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise ValueError(f"{key}={args[key]} must be a finite number {bound}{minimum:g}")
    return value


def _lengths(key: str, text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise ValueError(f"{key}: {part!r} is not a number") from None
        if not math.isfinite(value) or value <= 0 or value != int(value):
            raise ValueError(f"{key}: {part} must be a whole number of tokens > 0")
        out.append(int(value))
    if not out:
        raise ValueError(f"{key}= lists no history length")
    return out


def parse(argv: list[str]) -> tuple[WhatIf, list[int]]:
    """key=value arguments -> a WhatIf and the history lengths; ValueError says what's wrong."""
    args: dict[str, str] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"bad argument {arg!r}; expected key=value with key in {KEYS}")
        if key in args:
            raise ValueError(f"{key} given twice ({args[key]!r} and {value!r}): give it once")
        args[key] = value
    if "bandwidth_gb_s" in args and "bandwidth_gbps" in args:
        raise ValueError("give one of bandwidth_gbps (Gbit/s) or bandwidth_gb_s (GB/s), not both")
    for key in ("deployment", "concurrency"):
        if key in args and "policy" not in args:
            raise ValueError(f"{key}= chooses within a policy: give policy=<policy.json> too")
    calibrated = calibration(args) if "policy" in args else None
    shapes = known_shapes()
    name = args.get("model", calibrated.model if calibrated else "")
    if name not in shapes:
        raise ValueError(f"model={name!r} unknown; known: {', '.join(sorted(shapes))}")
    shape = shapes[name]
    if "kv_dtype" in args:
        try:
            dtype_nbytes(args["kv_dtype"])
        except ValueError as exc:
            raise ValueError(f"kv_dtype={args['kv_dtype']}: {exc}") from None
        shape = replace(shape, dtype=args["kv_dtype"])
    if "bandwidth_gb_s" in args:
        bandwidth = _number(args, "bandwidth_gb_s", None, 0.0, True) * 1e9
    elif "bandwidth_gbps" in args:
        bandwidth = _number(args, "bandwidth_gbps", None, 0.0, True) * 1e9 / 8
    else:
        raise ValueError("give bandwidth_gbps=<Gbit/s> or bandwidth_gb_s=<GB/s>")
    sources = {"bandwidth": "given (the fabric asked about: not measured)"}
    if "prefill_tok_s" in args:
        prefill = _number(args, "prefill_tok_s", None, 0.0, True)
        sources["prefill rate"] = "given"
    elif calibrated and calibrated.tokens_per_s:
        prefill, sources["prefill rate"] = calibrated.rate_for(shapes, name)
    else:
        raise ValueError("give prefill_tok_s=<tokens/s of one prefill instance>")
    if "alpha_ms" in args or not (calibrated and calibrated.t0_ms is not None):
        alpha_ms = _number(args, "alpha_ms", 0.0, 0.0, False)
        sources["alpha"] = "given" if "alpha_ms" in args else "assumed (0: no fixed cost)"
    else:
        alpha_ms = max(calibrated.t0_ms, 0.0)
        sources["alpha"] = calibrated.t0_source
    new_tokens = _number(args, "new_tokens", 64, 0.0, True)
    if new_tokens != int(new_tokens):
        raise ValueError(f"new_tokens={args['new_tokens']} must be a whole number of tokens")
    sources["new tokens, overhead"] = (
        "given" if {"new_tokens", "overhead_ms"} & set(args) else ("assumed (defaults)")
    )
    w = WhatIf(
        shape=shape,
        bandwidth_bytes_per_s=bandwidth,
        prefill_tok_s=prefill,
        alpha_s=alpha_ms / 1e3,
        new_tokens=int(new_tokens),
        overhead_s=_number(args, "overhead_ms", 0.0, 0.0, False) / 1e3,
        sources=sources if calibrated else {},
    )
    at = _lengths("at", args.get("at", "1024,8192,32768"))
    return w, at


@dataclass(frozen=True)
class Calibration:
    """What a policy.json measured for one deployment at one load."""

    model: str
    where: str  # "policy.json (deployment ..., concurrency 4)"
    t0_ms: float | None
    t0_text: str
    tokens_per_s: float | None
    rate_text: str

    @property
    def t0_source(self) -> str:
        clamp = " (negative: taken as 0)" if (self.t0_ms or 0.0) < 0 else ""
        return f"measured: P's fixed cost per pull, t0 {self.t0_text} ms, {self.where}{clamp}"

    def rate_for(self, shapes: dict[str, ModelShape], model: str) -> tuple[float, str]:
        """The measured rate for ``model``: as measured on its own model, else the same
        FLOP/s on this model's FLOPs per token (an assumption, said so)."""
        head = f"measured: P's recompute rate R_eff {self.rate_text} tok/s, {self.where}"
        mine = shapes.get(self.model)
        if model == self.model or mine is None:
            return float(self.tokens_per_s), head
        flops = self.tokens_per_s * mine.flops_per_token(0.0)
        return flops / shapes[model].flops_per_token(0.0), (
            f"{head}, rescaled from {self.model} to {model} by FLOPs per token (assumed)"
        )


def calibration(args: dict[str, str]) -> Calibration:
    """The policy's deployment and load that ``args`` choose (``policy``, ``deployment``,
    ``concurrency``); ValueError names what is missing."""
    pol = policy_file.read(args["policy"])
    deps = pol.deployments
    want = args.get("deployment")
    if want is not None:
        deps = [d for d in deps if want == d.deployment_id or want in d.label]
    if len(deps) != 1:
        names = ", ".join(d.deployment_id for d in pol.deployments) or "none"
        how = f"deployment={want!r} matches {len(deps)}" if want else f"it holds {len(deps)}"
        raise ValueError(f"policy={args['policy']}: {how} deployments; give deployment=<one of "
                         f"{names}>")  # fmt: skip
    dep = deps[0]
    rates = sorted(dep.recompute_rate, key=lambda r: r.concurrency or 0)
    beyond = ""
    if "concurrency" in args:
        level = _number(args, "concurrency", None, 0.0, True)
        band = dep.band(int(level))
        conc = band.concurrency if band else None
        rates = [r for r in rates if r.concurrency == conc] or rates
        measured = [r.concurrency for r in rates if r.concurrency]
        top = max((r.concurrency or 0 for r in dep.recompute_rate), default=0)
        if not top:
            beyond = (
                f"; the policy names no load (its run measured one, unnamed): concurrency "
                f"{level:g} is not known to it, its one rate is used, not extrapolated"
            )
        elif level > top:
            beyond = (
                f"; concurrency {level:g} lies above the highest load measured ({top}): "
                f"that load's rate is used, not extrapolated"
            )
        elif measured and level not in measured:
            beyond = f"; concurrency {level:g} was not measured: its band's ({measured[0]})"
    rate = rates[0] if rates else None
    where = f"{args['policy']} ({dep.deployment_id}"
    where += f", concurrency {rate.concurrency}" if rate and rate.concurrency else ""
    where += f"{beyond})"
    t0 = dep.pull_cost.t0_ms if dep.pull_cost else None
    return Calibration(
        model=dep.model,
        where=where,
        t0_ms=t0.value if t0 else None,
        t0_text=t0.text("{:,.2f}") if t0 else "",
        tokens_per_s=rate.tokens_per_s.value if rate else None,
        rate_text=rate.tokens_per_s.text() if rate else "",
    )


def alpha_sweep(w: WhatIf) -> list[float]:
    """Alphas (s) around the given one: 0, half, it, 2x, 5x; decades when it is 0."""
    if w.alpha_s <= 0:
        return [0.0, 1e-5, 1e-4, 1e-3, 1e-2]
    return [0.0, w.alpha_s / 2, w.alpha_s, 2 * w.alpha_s, 5 * w.alpha_s]


def crossover_at(w: WhatIf, alpha_s: float):
    saving = first_principles_saving(w.shape, w.flops_per_s, w.bandwidth_bytes_per_s, alpha_s)
    return predicted_crossover(saving)


def si(value: float, unit: str) -> str:
    """``1.5e9, "FLOP"`` -> ``"1.50 GFLOP"``."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def report(w: WhatIf, at: list[int]) -> list[str]:
    s = w.shape
    cross = crossover_at(w, w.alpha_s)
    compute_us = s.flops_per_token(0.0) / w.flops_per_s * 1e6
    pull_us = s.kv_bytes_per_token / w.bandwidth_bytes_per_s * 1e6
    lines = [
        f"model {s.name}: {si(s.params, 'params')}, "
        f"{si(s.flops_per_token(0.0), 'FLOP')} per short-prompt token, "
        f"KV {s.kv_bytes_per_token:,} bytes/token ({s.dtype})",
        f"prefill {w.prefill_tok_s:,.0f} tok/s = {si(w.flops_per_s, 'FLOP/s')}; "
        f"bandwidth {w.bandwidth_bytes_per_s / 1e9:.2f} GB/s "
        f"({w.bandwidth_bytes_per_s * 8 / 1e9:.0f} Gbit/s); alpha {w.alpha_s * 1e3:.3f} ms",
        f"per history token: recompute {compute_us:.2f} us (+ attention), pull {pull_us:.3f} us",
    ]
    if cross.shape is Shape.CROSSING:
        lines.append(f"predicted crossover: pull beats recompute above {cross.tokens:,.0f} tokens")
    else:
        lines.append(f"predicted crossover: {cross.describe()}")
    lines.append(f"{'history':>9}  {'recompute ms':>12}  {'pull ms':>9}  {'speedup':>7}")
    for h in at:
        r, p = w.recompute_s(h), w.pull_s(h)
        lines.append(f"{h:>9,}  {r * 1e3:>12.2f}  {p * 1e3:>9.2f}  {r / p:>6.2f}x")
    lines.append(
        f"(TTFT parts that differ: {w.new_tokens} new tokens computed in both flows, "
        f"overhead {w.overhead_s * 1e3:.1f} ms; speedup = recompute / pull)"
    )
    lines.append("how the crossover moves with alpha (the fixed cost per pull, least measured):")
    lines.append(f"{'alpha ms':>9}  {'crossover (tokens)':>18}")
    for alpha in alpha_sweep(w):
        c = crossover_at(w, alpha)
        text = f"{c.tokens:,.0f}" if c.shape is Shape.CROSSING else c.describe()
        used = "measured" if w.sources.get("alpha", "").startswith("measured") else "given"
        mark = f"  <- {used}" if alpha == w.alpha_s else ""
        lines.append(f"{alpha * 1e3:>9.3f}  {text:>18}{mark}")
    if w.sources:
        lines.append("where the inputs came from:")
        lines += [f"  {part}: {source}" for part, source in w.sources.items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    try:
        w, at = parse(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report(w, at)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
