"""Does the load generator measure what the server did? TTFT and ITL against a known truth.

The calibrated token source (``benchmarks/token_source.py``, its own process) streams tokens
on a fixed schedule, in chunks of ``--chunk-tokens`` (a pattern; several tokens per chunk as
vLLM sends them when its output lags), and records when it sent each chunk. Clients stream
from it at 1, 64 and 256 concurrent requests; per request, each client's TTFT, ITL, TPOT and
E2E are compared with the source's (TTFT: first send minus arrival; ITL: gaps between chunk
sends; TPOT: (last send - first send) / (tokens - 1); E2E: last send minus arrival). The
error is what the client adds: its own event-loop delays, parsing, scheduling. Both clients'
own statistics (``reported``: ITL over chunk gaps, TPOT over requests, E2E, as each defines
them) are saved beside the source's (``truth``), so the definitions are compared in one run.
Clients:

- ``pdbench``: ``jobs.workload.LoadGenerator`` in this process (as the deployment job runs
  it: ``jobs.workload.run_client``, uvloop when installed);
- ``vllm_bench_serve``: vLLM's ``vllm bench serve`` (``vllm.benchmarks.serve``) in a
  subprocess, backend ``openai``, random dataset, matched to the truth by the serial number
  the source writes into each token's text.

Run from the repository root::

    python -m benchmarks.timing_fidelity                       # 1, 64, 256 streams, both clients
    python -m benchmarks.timing_fidelity --streams 1,8 --tokens 16 --no-vllm-bench --out x.json
    python -m benchmarks.timing_fidelity --chunk-tokens 1,3,2    # multi-token chunks

The JSON (``benchmarks/results/timing_fidelity-<date>.json`` unless ``--out``) holds, per
client and stream count, p50/p99/max of |error| and the mean signed error (bias) in ms,
whether the token ids received equal the ids sent, how late the source itself was, and the
``reported`` vs ``truth`` statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.token_source import (
    intervals_ms,
    parse_chunk_pattern,
    sched_delta,
    sched_ms,
    serial_from_text,
)
from jobs.workload import run_client

REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "benchmarks" / "results"
MODEL = "token-source"
DEFAULT_STREAMS = (1, 64, 256)
VLLM_BENCH_SHIM = (
    "import sys\n"
    "from vllm.benchmarks.serve import add_cli_args, main\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "parser = FlexibleArgumentParser()\n"
    "add_cli_args(parser)\n"
    "main(parser.parse_args(sys.argv[1:]))\n"
)


# ---- shared by the benchmarks ----
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(values: list[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {"n": 0, "p50": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    a = np.asarray(values, dtype=float)
    return {
        "n": int(a.size),
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "max": float(a.max()),
        "mean": float(a.mean()),
    }


def environment() -> dict[str, Any]:
    import aiohttp

    return {
        "date": datetime.date.today().isoformat(),
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
        "host_cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "load_avg_start": list(os.getloadavg()),
    }


def default_out(name: str) -> Path:
    return RESULTS_DIR / f"{name}-{datetime.date.today().isoformat()}.json"


def save(path: Path, data: dict[str, Any]) -> None:
    data.setdefault("environment", {})["load_avg_end"] = list(os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def http_json(url: str, body: dict | None = None, timeout_s: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


# ---- comparing a client's measurements with the source's truth (pure) ----
def true_timings(truth: dict[str, Any]) -> dict[str, Any]:
    """What the source did for one request, in the clients' terms (ms): TTFT, ITL per chunk
    gap, TPOT = (last send - first send) / (tokens - 1) (0 for one token), E2E."""
    send, tokens = truth["send_s"], len(truth["token_ids"])
    span_ms = (send[-1] - send[0]) * 1e3
    return {
        "ttft_ms": (send[0] - truth["arrival_s"]) * 1e3,
        "itl_ms": intervals_ms(send),
        "tpot_ms": span_ms / (tokens - 1) if tokens > 1 else 0.0,
        "e2e_ms": (send[-1] - truth["arrival_s"]) * 1e3,
    }


def compare(
    ttft_ms: float,
    itl_ms: list[float],
    truth: dict[str, Any],
    ids: list[int] | None = None,
    tpot_ms: float | None = None,
    e2e_ms: float | None = None,
) -> dict[str, Any]:
    """One request's errors (measured minus true, ms); TPOT and E2E errors when given."""
    true = true_timings(truth)
    return {
        "ttft_error_ms": ttft_ms - true["ttft_ms"],
        "itl_error_ms": [m - t for m, t in zip(itl_ms, true["itl_ms"], strict=False)],
        "itl_count_ok": len(itl_ms) == len(true["itl_ms"]),
        # source chunks the client got in one read with the one before (the client, or the
        # source, ran late on a loaded host; a client cannot time what it reads together)
        "itl_gaps_merged": max(0, len(true["itl_ms"]) - len(itl_ms)),
        "tpot_error_ms": None if tpot_ms is None else tpot_ms - true["tpot_ms"],
        "e2e_error_ms": None if e2e_ms is None else e2e_ms - true["e2e_ms"],
        "ids_equal": None if ids is None else ids == truth["token_ids"],
        "late_ms": [(s - d) * 1e3 for s, d in zip(truth["send_s"], truth["due_s"], strict=True)],
    }


def summarize(rows: list[dict[str, Any]], requests: int, failed: list[str]) -> dict[str, Any]:
    ttft = [r["ttft_error_ms"] for r in rows]
    itl = [e for r in rows for e in r["itl_error_ms"]]
    tpot = [r["tpot_error_ms"] for r in rows if r.get("tpot_error_ms") is not None]
    e2e = [r["e2e_error_ms"] for r in rows if r.get("e2e_error_ms") is not None]
    ids = [r["ids_equal"] for r in rows if r["ids_equal"] is not None]
    return {
        "requests": requests,
        "matched": len(rows),
        "failed": len(failed),
        "errors": failed[:5],
        "ids_equal": (all(ids) if ids else None),
        "itl_count_mismatches": sum(not r["itl_count_ok"] for r in rows),
        # of those, requests with fewer gaps than the source sent chunks (merged on arrival;
        # a mismatch that is not one is a client error), and the gaps merged in all
        "itl_chunks_merged": sum(r.get("itl_gaps_merged", 0) > 0 for r in rows),
        "itl_gaps_merged": sum(r.get("itl_gaps_merged", 0) for r in rows),
        "ttft_abs_error_ms": stats([abs(e) for e in ttft]),
        "itl_abs_error_ms": stats([abs(e) for e in itl]),
        "tpot_abs_error_ms": stats([abs(e) for e in tpot]),
        "e2e_abs_error_ms": stats([abs(e) for e in e2e]),
        "ttft_bias_ms": stats(ttft)["mean"],
        "itl_bias_ms": stats(itl)["mean"],
        "tpot_bias_ms": stats(tpot)["mean"],
        "e2e_bias_ms": stats(e2e)["mean"],
        "source_late_ms": stats([x for r in rows for x in r["late_ms"]]),
    }


def definitions(
    itl_ms: list[float], tpot_ms: list[float], e2e_ms: list[float], tokens: int, chunks: int
) -> dict[str, Any]:
    """ITL over chunk gaps, TPOT over requests of 2+ tokens, E2E, tokens per chunk."""
    return {
        "itl_ms": stats(itl_ms),
        "tpot_ms": stats(tpot_ms),
        "e2e_ms": stats(e2e_ms),
        "tokens_per_chunk": tokens / chunks if chunks else 0.0,
    }


def truth_definitions(truths: list[dict[str, Any]]) -> dict[str, Any]:
    """``definitions`` of what the source did."""
    timings = [true_timings(t) for t in truths]
    return definitions(
        [x for t in timings for x in t["itl_ms"]],
        [t["tpot_ms"] for t, tr in zip(timings, truths, strict=True) if len(tr["token_ids"]) > 1],
        [t["e2e_ms"] for t in timings],
        sum(len(t["token_ids"]) for t in truths),
        sum(len(t["send_s"]) for t in truths),
    )


# ---- clients ----
async def pdbench_records(url: str, streams: int, requests: int, tokens: int, prompts: int, salt):
    from jobs.workload import LoadGenerator, RequestOptions, build_conversations
    from pdbench.config.schema import WorkloadConfig

    workload = WorkloadConfig(
        conversations=[requests], turns=1, user_tokens=prompts, output_tokens=0
    )
    specs = build_conversations(workload, 0, vocab_size=512)
    opts = RequestOptions(url, MODEL, tokens, "agg", salt, timeout_s=120.0)
    return await LoadGenerator(opts, streams, 0.0, 0).run(specs)


def measure_pdbench(
    url: str,
    streams: int,
    requests: int,
    tokens: int,
    prompt_tokens: int,
    timeout_s: float,
    cpus: set[int] | None = None,
):
    """``requests`` one-turn conversations, ``streams`` of them in flight at a time (on
    ``cpus`` if given)."""
    salt = f"fidelity-{streams}"
    http_json(f"{url}/reset", {})
    go = pdbench_records(url, streams, requests, tokens, prompt_tokens, salt)
    mask = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        before = sched_ms()
        records = run_client(asyncio.wait_for(go, timeout_s))
        client_sched = sched_delta(before, sched_ms())
    finally:
        os.sched_setaffinity(0, mask)
    served = http_json(f"{url}/truth")
    truth = {t["key"]: t for t in served["requests"]}
    rows, failed, matched = [], [], []
    for r in records:
        t = truth.get(f"{salt}:{r.conversation}")
        if r.status != "ok" or t is None:
            failed.append(r.error or f"conversation {r.conversation}: no truth")
            continue
        rows.append(compare(r.ttft_ms, r.itl_ms, t, r.output_token_ids, r.tpot_ms, r.e2e_ms))
        matched.append(t)
    out = summarize(rows, len(records), failed)
    ok = [r for r in records if r.status == "ok"]
    out["reported"] = definitions(
        [x for r in ok for x in r.itl_ms],
        [r.tpot_ms for r in ok if len(r.output_token_ids) > 1],
        [r.e2e_ms for r in ok],
        sum(len(r.output_token_ids) for r in ok),
        sum(len(r.chunk_tokens) for r in ok),
    )
    out["truth"] = truth_definitions(matched)
    out["sched_ms"] = {"client": client_sched, "source": served.get("sched_since_reset", {})}
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


class VllmBenchUnavailable(RuntimeError):
    """``vllm bench serve`` could not be run here; the message says why."""


def tiny_model_path() -> Path:
    """The tiny generated Llama, built once into the cache (vLLM serves it; its tokenizer
    feeds vllm bench's random dataset)."""
    from omegaconf import OmegaConf

    from pdbench.config.schema import ModelConfig
    from pdbench.driver.tiny_model import ensure_tiny_model

    raw = OmegaConf.to_container(OmegaConf.load(REPO / "conf/model/tiny_llama.yaml"))
    raw.pop("defaults", None)
    cache = os.environ.get("PDBENCH_CACHE_DIR", str(Path.home() / ".cache" / "pdbench"))
    return ensure_tiny_model(ModelConfig(**raw), cache)


def measure_vllm_bench(
    url: str,
    streams: int,
    requests: int,
    tokens: int,
    prompt_tokens: int,
    tokenizer: Path,
    workdir: Path,
    timeout_s: float,
    cpus: set[int] | None = None,
):
    http_json(f"{url}/reset", {})
    name = f"vllm-bench-{streams}.json"
    cmd = [
        sys.executable,
        "-c",
        VLLM_BENCH_SHIM,
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        url,
        "--model",
        MODEL,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(prompt_tokens),
        "--random-output-len",
        str(tokens),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(streams),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--disable-tqdm",
        "--seed",
        "0",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(workdir),
        "--result-filename",
        name,
    ]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=workdir,
            check=False,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
        )
    except subprocess.TimeoutExpired as exc:
        raise VllmBenchUnavailable(f"vllm bench serve did not finish in {timeout_s:.0f} s") from exc
    result_file = workdir / name
    if proc.returncode != 0 or not result_file.exists():
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-1500:]).strip()
        raise VllmBenchUnavailable(f"vllm bench serve exited {proc.returncode}: {tail}")
    result = json.loads(result_file.read_text())
    served = http_json(f"{url}/truth")
    truth = {t["serial"]: t for t in served["requests"]}
    rows, failed, matched = [], [], []
    texts = result.get("generated_texts") or []
    itls, tpots, e2els, tokens = [], [], [], 0
    for i, text in enumerate(texts):
        t = truth.get(serial_from_text(text))
        if t is None:
            failed.append((result.get("errors") or [""] * len(texts))[i] or f"request {i}")
            continue
        ttft_ms = result["ttfts"][i] * 1e3
        itl_ms = [x * 1e3 for x in result["itls"][i]]
        e2e_ms = result["latencies"][i] * 1e3
        n = result["output_lens"][i]
        tpot_ms = (e2e_ms - ttft_ms) / (n - 1) if n > 1 else 0.0  # as serve.py computes it
        rows.append(compare(ttft_ms, itl_ms, t, None, tpot_ms, e2e_ms))
        matched.append(t)
        itls += itl_ms
        tpots += [tpot_ms] if n > 1 else []
        e2els.append(e2e_ms)
        tokens += n
    out = summarize(rows, len(texts), failed)
    out["reported"] = definitions(itls, tpots, e2els, tokens, len(itls) + len(matched))
    out["reported"]["vllm_summary_ms"] = {  # what vllm bench serve itself printed and saved
        k: result.get(k)
        for k in (
            "mean_itl_ms",
            "median_itl_ms",
            "mean_tpot_ms",
            "median_tpot_ms",
            "mean_e2el_ms",
            "median_e2el_ms",
        )
    }
    out["truth"] = truth_definitions(matched)
    out["sched_ms"] = {"source": served.get("sched_since_reset", {})}  # client: a subprocess
    out["load_avg_1m"] = os.getloadavg()[0]
    return out


# ---- the run ----
def run(args: argparse.Namespace) -> dict[str, Any]:
    from jobs.serving.server import ServerProcess

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    data: dict[str, Any] = {
        "benchmark": "timing_fidelity",
        "environment": environment(),
        "config": {
            "streams": args.streams,
            "tokens": args.tokens,
            "rounds": args.rounds,
            "prompt_tokens": args.prompt_tokens,
            "ttft_ms": args.ttft_ms,
            "itl_ms": args.itl_ms,
            "source_loop": args.source_loop,
            "chunk_tokens": list(args.chunk_tokens),
            "cpus": None,
        },
        "results": {"pdbench": {}, "vllm_bench_serve": {}},
    }
    source_cmd = [
        sys.executable,
        "-m",
        "benchmarks.token_source",
        "--port",
        str(port),
        "--ttft-ms",
        str(args.ttft_ms),
        "--itl-ms",
        str(args.itl_ms),
        "--model",
        MODEL,
        "--loop",
        args.source_loop,
        "--chunk-tokens",
        ",".join(str(n) for n in args.chunk_tokens),
    ]
    per_run_s = args.rounds * (args.ttft_ms + args.tokens * args.itl_ms) / 1e3 + 60.0
    vllm_reason = "" if args.vllm_bench else "skipped (--no-vllm-bench)"
    tokenizer = None
    if args.vllm_bench:
        try:
            tokenizer = tiny_model_path()
        except Exception as exc:  # reported in the results, not fatal for pdbench's numbers
            vllm_reason = f"no tokenizer for the random dataset: {type(exc).__name__}: {exc}"
    with tempfile.TemporaryDirectory(prefix="pdbench-fidelity-") as tmp:
        work = Path(tmp)
        env = {"PYTHONPATH": str(REPO)}
        log = work / "source.log"
        with ServerProcess("token-source", source_cmd, env, log, f"{url}/health") as source:
            client_cpus = None
            if args.pin:
                client_cpus, source_cpus = split_cpus()
                os.sched_setaffinity(source.pid, source_cpus)
                data["config"]["cpus"] = {
                    "client": sorted(client_cpus),
                    "source": sorted(source_cpus),
                }
            source.wait_until_ready(60.0, poll_s=0.1)
            for streams in args.streams:
                key, requests = str(streams), streams * args.rounds
                pd = measure_pdbench(
                    url, streams, requests, args.tokens, args.prompt_tokens, per_run_s, client_cpus
                )
                data["results"]["pdbench"][key] = pd
                _print_row("pdbench", streams, pd)
                if vllm_reason:
                    continue
                try:
                    vb = measure_vllm_bench(
                        url,
                        streams,
                        requests,
                        args.tokens,
                        args.prompt_tokens,
                        tokenizer,
                        work,
                        per_run_s + 180.0,
                        client_cpus,
                    )
                except VllmBenchUnavailable as exc:
                    vllm_reason = str(exc)
                    continue
                data["results"]["vllm_bench_serve"][key] = vb
                _print_row("vllm bench", streams, vb)
    if vllm_reason:
        data["results"]["vllm_bench_serve"]["unavailable"] = vllm_reason
        print(f"vllm bench serve: {vllm_reason.splitlines()[0] if vllm_reason else ''}")
    return data


def split_cpus() -> tuple[set[int], set[int]]:
    """(client CPUs, source CPUs): the source gets the last CPU of this process's set, the
    client the others, so that the instrument does not preempt the client it measures."""
    cpus = sorted(os.sched_getaffinity(0))
    return set(cpus[:-1]), {cpus[-1]}


def _print_row(client: str, streams: int, s: dict[str, Any]) -> None:
    t, i, late = s["ttft_abs_error_ms"], s["itl_abs_error_ms"], s["source_late_ms"]
    tp, e = s["tpot_abs_error_ms"], s["e2e_abs_error_ms"]
    rep, true = s["reported"], s["truth"]
    print(
        f"{client:<11} streams={streams:<4} ok={s['matched']}/{s['requests']} "
        f"ids_equal={s['ids_equal']}  TTFT |err| p50={t['p50']:.3f} p99={t['p99']:.3f} ms  "
        f"ITL |err| p50={i['p50']:.3f} p99={i['p99']:.3f} max={i['max']:.3f} ms  "
        f"TPOT |err| p50={tp['p50']:.3f} p99={tp['p99']:.3f} ms  "
        f"E2E |err| p50={e['p50']:.3f} p99={e['p99']:.3f} ms  "
        f"(source late p99={late['p99']:.3f} ms; waited for a CPU: {_waits(s['sched_ms'])}; "
        f"load {s['load_avg_1m']:.2f})\n"
        f"{'':<11} reported (truth): ITL n={rep['itl_ms']['n']} ({true['itl_ms']['n']}) "
        f"p50={rep['itl_ms']['p50']:.2f} ({true['itl_ms']['p50']:.2f}) ms, "
        f"TPOT mean={rep['tpot_ms']['mean']:.2f} ({true['tpot_ms']['mean']:.2f}) ms, "
        f"E2E mean={rep['e2e_ms']['mean']:.1f} ({true['e2e_ms']['mean']:.1f}) ms, "
        f"tokens/chunk={rep['tokens_per_chunk']:.2f} ({true['tokens_per_chunk']:.2f})",
        flush=True,
    )


def _waits(sched: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{k} {v['run_delay_ms']:.0f} ms" for k, v in sched.items() if v) or "n/a"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--streams",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(DEFAULT_STREAMS),
        help="comma-separated concurrent stream counts (default 1,64,256)",
    )
    parser.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    parser.add_argument(
        "--rounds", type=int, default=4, help="requests per stream (streams x rounds in all)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=20.0)
    parser.add_argument("--source-loop", choices=("asyncio", "uvloop"), default="uvloop")
    parser.add_argument(
        "--chunk-tokens",
        type=parse_chunk_pattern,
        default=(1,),
        help="tokens per chunk the source sends, a pattern repeated (default 1; e.g. 1,3,2)",
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) >= 2,
        help="source on its own CPU, clients on the others (default: with 2+ CPUs)",
    )
    parser.add_argument(
        "--vllm-bench", action=argparse.BooleanOptionalAction, default=True, help="also run it"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if any(n < 1 or n > 1024 for n in args.streams) or not 1 <= args.tokens <= 4096:
        parser.error("streams must be in 1..1024 and tokens in 1..4096")
    if not 1 <= args.rounds <= 64:
        parser.error("rounds must be in 1..64")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    data = run(args)
    out = args.out or default_out("timing_fidelity")
    save(out, data)
    print(f"saved {out}")
    return data


if __name__ == "__main__":
    main()
