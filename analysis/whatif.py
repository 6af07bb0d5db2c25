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

Model: computing ``h`` history tokens costs their FLOPs (``analysis.model_cost``) at
``prefill_tok_s x FLOPs per short-prompt token``; pulling them costs ``alpha + h x KV bytes
per token / bandwidth``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

from analysis.crossover import CROSSING, first_principles_saving, predicted_crossover
from analysis.model_cost import ModelShape, known_shapes

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
)


@dataclass
class WhatIf:
    shape: ModelShape
    bandwidth_bytes_per_s: float
    prefill_tok_s: float
    alpha_s: float = 0.0
    new_tokens: int = 64
    overhead_s: float = 0.0

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


def parse(argv: list[str]) -> tuple[WhatIf, list[int]]:
    """key=value arguments -> a WhatIf and the history lengths; ValueError says what's wrong."""
    args: dict[str, str] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in KEYS:
            raise ValueError(f"bad argument {arg!r}; expected key=value with key in {KEYS}")
        args[key] = value
    shapes = known_shapes()
    name = args.get("model", "")
    if name not in shapes:
        raise ValueError(f"model={name!r} unknown; known: {', '.join(sorted(shapes))}")
    shape = shapes[name]
    if "kv_dtype" in args:
        shape = replace(shape, dtype=args["kv_dtype"])
    if "bandwidth_gb_s" in args:
        bandwidth = float(args["bandwidth_gb_s"]) * 1e9
    elif "bandwidth_gbps" in args:
        bandwidth = float(args["bandwidth_gbps"]) * 1e9 / 8
    else:
        raise ValueError("give bandwidth_gbps=<Gbit/s> or bandwidth_gb_s=<GB/s>")
    if "prefill_tok_s" not in args:
        raise ValueError("give prefill_tok_s=<tokens/s of one prefill instance>")
    w = WhatIf(
        shape=shape,
        bandwidth_bytes_per_s=bandwidth,
        prefill_tok_s=float(args["prefill_tok_s"]),
        alpha_s=float(args.get("alpha_ms", 0)) / 1e3,
        new_tokens=int(args.get("new_tokens", 64)),
        overhead_s=float(args.get("overhead_ms", 0)) / 1e3,
    )
    if w.bandwidth_bytes_per_s <= 0 or w.prefill_tok_s <= 0:
        raise ValueError("bandwidth and prefill_tok_s must be > 0")
    at = [int(x) for x in args.get("at", "1024,8192,32768").split(",") if x.strip()]
    return w, at


def si(value: float, unit: str) -> str:
    """``1.5e9, "FLOP"`` -> ``"1.50 GFLOP"``."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def report(w: WhatIf, at: list[int]) -> list[str]:
    s = w.shape
    saving = first_principles_saving(s, w.flops_per_s, w.bandwidth_bytes_per_s, w.alpha_s)
    cross = predicted_crossover(saving)
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
    if cross.status == CROSSING:
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
