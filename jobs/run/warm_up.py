"""Before the first Point: one short two-turn conversation per (flow, history length) of the
Points (one per P-D pair where there are several), so that neither the first NIXL
handshakes between each P and D (both directions) nor the first run of a prompt length is
charged to the first Point of a flow. Its records are kept apart, in
``warmup/<deployment>.jsonl``, to show what those first times cost."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

from connector.process_env import bearer
from jobs.workload import LoadGenerator, RequestOptions, build_conversations, run_client
from pdbench.config.schema import WorkloadConfig
from pdbench.plan.deployments import Deployment
from pdbench.plan.points import Point
from pdbench.results.store import RunStore, write_lines_atomic
from pdbench.spec.serve_command import served_model_name
from pdbench.traffic.recorded import WARMUP_TAG
from records.point import RequestRecord


def warm_workload(dep: Deployment) -> tuple[WorkloadConfig, int]:
    """The warm-up's workload and its conversations: one per (P, D) pair, two short turns."""
    n = max(len(dep.by_role("prefill")) * len(dep.by_role("decode")), 1)
    return WorkloadConfig(
        conversations=[n], turns=2, user_tokens=32, output_tokens=4, seed=12345
    ), n


def warm_up(dep: Deployment, points: list[Point], router_url: str, store: RunStore) -> None:
    cases = list(dict.fromkeys((p.flow, p.history_tokens) for p in points))
    warm, n = warm_workload(dep)
    model = served_model_name(dep)

    async def go():
        import aiohttp  # lazy: ~0.4 s, a client library the driver never needs

        records: list[RequestRecord] = []
        async with aiohttp.ClientSession(headers=bearer(os.environ)) as session:
            for flow, history in cases:
                tag = f"{WARMUP_TAG}{flow.value}-h{history}-{time.time()}"
                body = {"flow": flow.value, "tag": tag}
                async with session.post(f"{router_url}/pdbench/flow", json=body) as r:
                    r.raise_for_status()
                specs = build_conversations(warm, history, dep.model.vocab_size)
                opts = RequestOptions(router_url, model, 4, flow.value, tag)
                records += await LoadGenerator(opts, n, 0.0, 0).run(specs)
        return records

    t0 = time.perf_counter()
    records = run_client(go())
    took = time.perf_counter() - t0
    path = store.root / "warmup" / f"{dep.deployment_id}.jsonl"
    # a search warms up each length it adds: earlier warm-ups of the run stay in the file
    kept = path.read_text().splitlines() if path.exists() else []
    write_lines_atomic(path, [*(json.loads(line) for line in kept), *(asdict(r) for r in records)])
    ok = sum(r.status == "ok" for r in records)
    print(
        f"[pdbench] warm-up ({len(cases)} flow x history cases): {ok}/{len(records)} ok "
        f"in {took:.1f} s",
        flush=True,
    )
