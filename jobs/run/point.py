"""One Point measured on running servers: set the router's flow, drive the load in turn
waves, scrape every server between waves, then the record: summary, per-turn rows, TTFT
split, decode bill, flags (``jobs.run.flags``) and which servers died."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from connector.process_env import bearer
from connector.ucx_proto import transports_in_log
from jobs.measure import attribution, decode_bill, kv_sampler, metrics, ttft_split
from jobs.run import flags
from jobs.run.state import TaskState
from jobs.serving.server_log import LogWindow, log_tail
from jobs.trace_replay import replay_for, trace_conversations
from jobs.workload import LoadGenerator, RequestOptions, build_conversations, run_client
from pdbench.config.schema import Flow, WorkloadKind
from pdbench.plan import arrivals
from pdbench.plan.deployments import Deployment
from pdbench.plan.points import Point, only
from pdbench.results.store import RunStore
from pdbench.spec.launch import DeploymentSpec
from pdbench.spec.serve_command import served_model_name
from records.point import PointResult, PointStatus, RequestRecord

KV_TAIL_MARGIN_S = 5.0  # flow.kv_tail samples D at most its TTL plus this after the load


@dataclass(frozen=True)
class Serving:
    """What is up while task 0 measures: the spec as it ran, every instance's URL, the
    router's, and where each instance runs."""

    deployment: Deployment
    ran: DeploymentSpec
    urls: dict[str, str]
    router_url: str
    hosts: dict[str, str]  # instance name -> "hostname (address)"


def new_record(dep: Deployment, point: Point, task: TaskState, **known) -> PointResult:
    """The record of ``point`` before it is measured: failed, until measuring says more."""
    return PointResult(
        point_id=point.point_id,
        status=PointStatus.failed,
        error="",
        flow=point.flow.value,
        deployment=dep.record(),
        workload=point.workload_record(),
        repetition=point.repetition,
        order_index=point.order_index,
        job_id=task.job_id,
        attempt=task.attempt,
        **known,
    )


def measure_point(
    serving: Serving, point: Point, store: RunStore, task: TaskState, label: str
) -> tuple[PointResult, list[RequestRecord]]:
    """Measure ``point``; its record (failed, with the reason, when anything went wrong) and
    its requests."""
    dep, ran = serving.deployment, serving.ran
    result = new_record(
        dep,
        point,
        task,
        hosts=serving.hosts,
        launch_spec_file=str(store.launch_spec_path(dep.deployment_id).relative_to(store.root)),
        started_at=time.time(),
    )
    records: list[RequestRecord] = []
    # This Point's stretch of the P/D servers' logs (every Point of a Deployment shares them).
    pd = [i for i in ran.instances if i.role != "mixed"]
    logs = LogWindow([i.log_path for i in pd])
    try:
        records, per_turn, totals, duration, result.router, waves, kv, stopped = run_client(
            drive(serving, point, label, lambda: [p.name for p in task.dead()])
        )
        split_ttft(ran, records, per_turn, waves)
        result.offered_load = offered(point, records)
        result.summary = attribution.summarize(records, duration)
        result.by_turn = per_turn
        result.metrics = totals
        result.transfer = attribution.transfer_totals(totals)
        bill_decode(dep, result, records, totals, kv)
        failed = result.summary.failed_requests
        result.status = PointStatus.ok if failed == 0 else PointStatus.failed
        if failed:
            first = next(r for r in records if r.status != "ok")
            result.error = f"{failed} of {len(records)} requests failed; first: {first.error}"
        if stopped:  # a server died: the turns answered are kept, the rest were cut
            result.status = PointStatus.failed
            result.error = "; ".join(x for x in (stopped, result.error) if x)
    except Exception as exc:  # the Point fails, the record says why
        result.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
    stretch = logs.read()  # this Point's part of the P/D logs, read once
    # UCX prints a path once per endpoint: the whole log says what carried KV so far.
    result.transport_used = {i.name: transports_in_log(Path(i.log_path)) for i in pd}
    prefill = [stretch.get(i.log_path, "") for i in pd if i.role == "prefill"]
    result.flags += [
        *flags.transport_flags(pd, result.transport_used, dep.transport),
        *flags.lease_flags(prefill, result.point_id),
        *flags.transfer_flags(result.transfer, dep.server.kv_load_failure_policy, dep.transport),
        *flags.kv_load_flags("".join(stretch.values())),
        *flags.handoff_flags(result.router),
        *flags.expired_lease_flags(result.router, dep.decoder_kv_blocks_ttl_s),
        *flags.open_loop_flags(result.offered_view),
    ]
    result.trace_files = sorted(
        str(p.relative_to(store.root)) for p in Path(ran.traces_dir).glob("*.jsonl")
    )
    dead = task.dead()
    if dead:
        tails = "\n".join(f"--- {p.name} ({p.log_path}):\n{log_tail(p.log_path, 20)}" for p in dead)
        result.status = PointStatus.failed
        result.error = (
            f"server(s) died during the point: {[p.name for p in dead]}\n{tails}\n" + result.error
        )
    result.finished_at = time.time()
    return result, records


def offered(point: Point, records: list[RequestRecord]) -> dict:
    """Open loop: what the schedule offered and what the deployment took ({} for waves)."""
    wl = point.workload
    offered_s = [r.offered_s for r in records if r.offered_s >= 0]
    if not offered_s or len(offered_s) < len(records):
        return {}  # waves: nothing was offered at a time
    rate = wl.request_rate
    if wl.kind is WorkloadKind.trace:  # what the replay offered, over its span
        span = max(offered_s) - min(offered_s)
        rate = len(offered_s) / span if span > 0 else 0.0
    load = arrivals.offered_load(
        rate,
        [r.offered_s for r in records],
        [r.start_s for r in records],
        [r.start_s + r.e2e_ms / 1e3 for r in records if r.status == "ok"],
    )
    return load.record()


T = TypeVar("T")
DEAD_POLL_S = 1.0  # how often a Point's load looks for a dead server
# after a death, how long turns in flight on the live servers may take to end by themselves
# (those on the dead one would wait out their timeout) before the load is cut
DEAD_GRACE_S = 5.0


class ServerDied(RuntimeError):
    """A server of the deployment died while a Point's load ran."""


async def until_a_server_dies(work: Awaitable[T], dead: Callable[[], list[str]]) -> T:
    """``work``'s result; once ``dead`` names a server, ``DEAD_GRACE_S`` more for it to end
    by itself (turns on the live servers finish, those of the dead one fail), then cancelled
    and ``ServerDied`` naming the servers (a killed API server whose engine core still holds
    its socket would leave requests waiting for their timeout)."""
    running = asyncio.ensure_future(work)
    while True:
        done, _ = await asyncio.wait({running}, timeout=DEAD_POLL_S)
        if done:
            return running.result()
        names = dead()
        if names:
            done, _ = await asyncio.wait({running}, timeout=DEAD_GRACE_S)
            if done:
                return running.result()
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            raise ServerDied(f"the load stopped: {', '.join(names)} died")


def split_ttft(ran: DeploymentSpec, records: list[RequestRecord], per_turn, waves) -> None:
    """Each request's TTFT in parts (jobs/measure/ttft_split.py), per turn their means."""
    servers = ttft_split.read_server_timing(ran.timing_dir, ttft_split.wanted_ids(records))
    ttft_split.apply(records, servers, waves)
    for row in per_turn:
        attribution.add_split(row, [r for r in records if r.turn == row.turn])


def bill_decode(dep: Deployment, result: PointResult, records, totals, kv) -> None:
    """The decode instances' bill (KV held over time, D's own ITL/TPOT) and the samples."""
    result.kv_timeline = kv.timeline if kv is not None else {}
    result.decode_bill = decode_bill.bill(
        records,
        result.kv_timeline,
        kv.blocks if kv is not None else {},
        kv.load_end_s if kv is not None else 0.0,
        totals,
        [i.name for i in dep.by_role("decode")],
        dep.server.block_size,
        dep.decoder_kv_blocks_ttl_s,
        dep.bidirectional,
    )


async def drive(serving: Serving, point: Point, label: str, dead: Callable[[], list[str]] = list):
    """The Point's load through the router, every server scraped between turn waves; the
    load is stopped within ``DEAD_POLL_S`` of a server's death (``dead``: the names of the
    task's processes that died), not left to its requests' timeouts."""
    import aiohttp  # lazy: ~0.4 s, a client library the driver never needs

    dep, urls, router_url = serving.deployment, serving.urls, serving.router_url
    wl = point.workload
    names = list(urls)
    prefill_names = [i.name for i in dep.by_role("prefill")]
    serving_names = {
        Flow.agg: [dep.agg_instance.name],
        Flow.recompute: prefill_names,
        Flow.pull: prefill_names,
        Flow.policy: prefill_names,
        Flow.static_light: prefill_names,
        Flow.static_heavy: prefill_names,
        Flow.decode_first: prefill_names + [i.name for i in dep.by_role("decode")],
    }[point.flow]
    if wl.kind is WorkloadKind.trace:
        model_path = serving.ran.model_path
        replay = replay_for(wl, model_path, dep.model.generate)
        specs = trace_conversations(wl, replay, dep.model.vocab_size, model_path)
    else:
        specs = build_conversations(wl, point.history_tokens, dep.model.vocab_size)
    opts = RequestOptions(
        url=router_url,
        model=served_model_name(dep),
        output_tokens=wl.output_tokens,
        flow=point.flow.value,
        salt=point.point_id,
        timeout_s=wl.request_timeout_s,
        api=wl.api.value,
    )
    gen = LoadGenerator(
        opts,
        only(wl.concurrency, "workload.concurrency"),
        wl.request_rate,
        wl.seed,
        wl.arrival.value,
        wl.burstiness,
    )
    await gen.prepare(specs)  # chat: the messages' text, before the load's clock starts
    per_turn: list = []
    totals: dict[str, dict[str, float]] = {}
    waves: dict[int, ttft_split.WaveTiming] = {}  # the split's per-wave stand-in
    answering = (
        [dep.agg_instance.name]
        if point.flow is Flow.agg
        else [i.name for i in dep.by_role("decode")]
    )
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, headers=bearer(os.environ)) as session:
        flow_body = {"flow": point.flow.value, "tag": point.point_id}
        async with session.post(f"{router_url}/pdbench/flow", json=flow_body) as r:
            if r.status != 200:
                raise RuntimeError(f"router refused flow {point.flow.value}: {await r.text()}")

        state: dict = {"before": {}}

        async def snapshot():
            got = await asyncio.gather(
                *(metrics.scrape_async(session, urls[n]) for n in names),
                return_exceptions=True,
            )
            # a server that died keeps its last counters: no delta, and the Point goes
            # on (its requests fail and are recorded; the record names the dead server)
            last = state["before"]
            return {
                n: last.get(n, {}) if isinstance(g, BaseException) else g
                for n, g in zip(names, got, strict=True)
            }

        state["before"] = await snapshot()

        async def on_wave_done(turn: int, wave: list[RequestRecord]):
            # Counters settle after the response; a short bounded wait for NIXL stats.
            await asyncio.sleep(0.3)
            after = await snapshot()
            deltas = {n: metrics.delta(state["before"][n], after[n]) for n in names}
            state["before"] = after
            attribution.add_deltas(totals, deltas)
            per_turn.append(attribution.turn_row(turn, wave, deltas, prefill_names, serving_names))
            waves[turn] = ttft_split.WaveTiming.from_deltas(deltas, prefill_names, answering)
            ok = sum(r.status == "ok" for r in wave)
            print(f"[pdbench] {label} turn {turn}: {ok}/{len(wave)} ok", flush=True)

        # D's KV occupancy over the Point (and the TTL's tail: flow.kv_tail)
        tail_s = dep.decoder_kv_blocks_ttl_s + KV_TAIL_MARGIN_S if dep.flow.kv_tail else 0.0
        decode = [i.name for i in dep.by_role("decode")]
        kv = await kv_sampler.start(session, urls, dep.flow.kv_sample_period_s, decode, tail_s)
        t0 = time.perf_counter()
        stopped = ""
        try:
            records = await until_a_server_dies(gen.run(specs, on_wave_done=on_wave_done), dead)
        except ServerDied as died:  # the turns answered so far are kept
            records, stopped = (
                sorted(gen.finished, key=lambda r: (r.turn, r.conversation)),
                str(died),
            )
        if kv is not None:
            await (kv.cancel() if stopped else kv.stop())  # a dead port is not asked again
        duration = time.perf_counter() - t0
        router_stats: dict = {}
        if not stopped:
            async with session.get(f"{router_url}/pdbench/stats") as r:
                router_stats = await r.json()
    return records, per_turn, totals, duration, router_stats, waves, kv, stopped
