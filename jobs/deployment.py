"""The deployment job: runs on every task of the allocation.

Every task starts the vLLM servers placed on its node, waits for them to be healthy and
publishes their URLs in the run dir (rendezvous). Task 0 then starts the router and, for
each Point not yet recorded ``ok``, sets the flow, drives the load generator in turn waves,
scrapes every server's counters between waves and writes the PointResult. Every task tears
its servers down when task 0 is done, on error, on SIGTERM, or at the time limit (submitit
checkpoint: requeue, and the requeued job resumes from the records).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
import traceback
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import submitit

from connector.shared_files import poll_until
from connector.ucx_proto import tcp_fallback, transports_in_log
from pdbench import attribution, decode_bill, kv_sampler, metrics
from pdbench.config import Flow, TrackingConfig, WorkloadConfig
from pdbench.launch_spec import LOOPBACK, DeploymentSpec, InstanceSpec, RouterSpec, resolve
from pdbench.plan import Deployment, Point
from pdbench.results import (
    PointResult,
    PointStatus,
    RequestRecord,
    RunStore,
    write_json_atomic,
    write_lines_atomic,
)
from pdbench.serve_command import served_model_name
from pdbench.server import ServerProcess, ServerStartError, log_tail
from pdbench.slurm_env import TaskEnvironment
from pdbench.tracking import make_tracker
from pdbench.workload import LoadGenerator, RequestOptions, build_conversations, run_client

RENDEZVOUS_TIMEOUT_S = 600.0  # how long task 0 waits for every node's servers


class NodeFailed(RuntimeError):
    """Another task of the job could not start its servers."""


class JobInterrupted(Exception):
    """SIGTERM reached the task (preemption, scancel): tear down and leave."""


def task_identity() -> tuple[int, str]:
    """(global rank, job id) of this task."""
    env = TaskEnvironment.from_environ()
    return env.global_rank, env.job_id or str(os.getpid())


def node_address(spec: DeploymentSpec) -> str:
    """The address this task's servers bind and are reached at: loopback when every task
    runs on this machine, the SLURM node's own address otherwise (never localhost across
    nodes). The one place a spec's address placeholders get their value."""
    return LOOPBACK if spec.local else TaskEnvironment.from_environ().address


@dataclass
class DeploymentJob:
    """A picklable submitit callable for one Deployment: runs its launch spec."""

    deployment: Deployment
    points: list[Point]
    spec: DeploymentSpec
    tracking: TrackingConfig
    run_config: dict[str, Any]  # the composed config as JSON, for the tracker

    def __call__(self) -> dict[str, Any]:
        rank, job_id = task_identity()
        host = node_address(self.spec)
        spec = resolve(self.spec, {rank: host})
        store = RunStore(spec.run_dir)
        # A requeued job keeps its id: the restart count keeps its rendezvous apart.
        attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
        rdv = Path(spec.rendezvous_dir) / f"{job_id}.{attempt}"
        rdv.mkdir(parents=True, exist_ok=True)
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            with ExitStack() as stack:
                try:
                    self._procs: list[tuple[InstanceSpec | None, ServerProcess]] = []
                    urls = self._start_servers(stack, spec.on_node(rank), rank)
                    write_json_atomic(
                        rdv / f"node{rank}.json",
                        {"host": host, "hostname": socket.gethostname(), "urls": urls},
                    )
                    if rank != 0:
                        self._wait_for_rank0(rdv)
                        return {"rank": rank, "host": host}
                    nodes = self._gather_nodes(rdv)
                    # Every node's address is known now: the spec as it ran, for the records.
                    ran = resolve(self.spec, nodes["addresses"])
                    write_json_atomic(store.launch_spec_path(ran.deployment_id), ran.to_dict())
                    return self._run_points(stack, store, ran, nodes["hosts"])
                except (ServerStartError, TimeoutError, NodeFailed) as exc:
                    # The deployment cannot run: every pending Point says why, in its record.
                    write_json_atomic(rdv / f"node{rank}.failed.json", {"error": str(exc)})
                    if rank == 0:
                        self._fail_pending(store, f"deployment did not start: {exc}")
                    raise
                finally:
                    if rank == 0:
                        write_json_atomic(rdv / "done.json", {"at": time.time()})
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _wait_for_rank0(self, rdv: Path) -> None:
        while not (rdv / "done.json").exists():
            if (rdv / "node0.failed.json").exists():
                raise NodeFailed(json.loads((rdv / "node0.failed.json").read_text())["error"])
            time.sleep(1.0)

    def _fail_pending(self, store: RunStore, error: str) -> None:
        for point in self.points:
            if store.point_status(point.point_id) is PointStatus.ok:
                continue
            result = PointResult(
                point_id=point.point_id,
                status=PointStatus.failed,
                error=error,
                flow=point.flow.value,
                deployment=self.deployment.record(),
                workload=point.workload_record(),
                started_at=time.time(),
                finished_at=time.time(),
            )
            store.write_point(result, [])

    def checkpoint(self, *args, **kwargs):
        """Requeue on preemption / time limit; the new job skips Points recorded ``ok``."""

        return submitit.helpers.DelayedSubmission(self)

    # ---- servers ----
    def _start_servers(self, stack, mine: list[InstanceSpec], rank: int) -> dict[str, str]:
        procs: list[tuple[InstanceSpec, ServerProcess]] = []
        for inst in mine:
            proc = ServerProcess(
                name=f"{inst.name} (node {rank})",
                cmd=inst.command,
                env=inst.env,
                log_path=Path(inst.log_path),
                health_url=inst.health_url,
            )
            stack.enter_context(proc)
            procs.append((inst, proc))
        for inst, proc in procs:
            took = proc.wait_until_ready(self.deployment.server.startup_timeout_s)
            print(
                f"[pdbench] {inst.name} healthy on {inst.host}:{inst.http_port} in {took:.0f} s",
                flush=True,
            )
        self._procs.extend(procs)
        return {inst.name: inst.url for inst, _ in procs}

    def _gather_nodes(self, rdv: Path) -> dict[str, Any]:
        def all_there():
            for failed in rdv.glob("node*.failed.json"):
                raise NodeFailed(f"{failed.stem}: {json.loads(failed.read_text())['error']}")
            files = [rdv / f"node{n}.json" for n in range(self.spec.nodes)]
            return files if all(f.exists() for f in files) else None

        files = poll_until(all_there, RENDEZVOUS_TIMEOUT_S, "every node's servers", max_pause_s=0.5)
        hosts: dict[str, str] = {}
        addresses: dict[int, str] = {}
        for node, f in enumerate(files):
            data = json.loads(f.read_text())
            addresses[node] = data["host"]
            for name in data["urls"]:
                hosts[name] = f"{data['hostname']} ({data['host']})"
        return {"hosts": hosts, "addresses": addresses}

    # ---- points (task 0) ----
    def _run_points(self, stack, store: RunStore, ran: DeploymentSpec, hosts) -> dict[str, Any]:

        self._ran = ran
        urls = {inst.name: inst.url for inst in ran.instances}
        router_url = self._start_router(stack, ran.router, ran.kv_params_dir)
        tracker = make_tracker(self.tracking, store.root, store.root.name)
        if any(store.point_status(p.point_id) is not PointStatus.ok for p in self.points):
            self._warm_up(router_url, store)
        done, failed, skipped = 0, 0, 0
        for i, point in enumerate(self.points, 1):
            if store.point_status(point.point_id) is PointStatus.ok:
                skipped += 1
                continue
            label = f"[{i}/{len(self.points)}] {point.flow.value} h={point.history_tokens}"
            print(f"[pdbench] point {label} ({point.point_id})", flush=True)
            result, records = self._measure(point, urls, router_url, hosts, store, label)
            store.write_point(result, records)
            tracker.log_point(result.to_dict(), self.run_config)
            if result.status is PointStatus.ok:
                done += 1
            else:
                failed += 1
                dead = [p.name for _, p in self._procs if not p.alive()]
                if dead:
                    print(f"[pdbench] servers died: {dead}; stopping this deployment", flush=True)
                    break
        tracker.close()
        return {
            "deployment": ran.deployment_id,
            "ok": done,
            "failed": failed,
            "skipped": skipped,
        }

    def _start_router(self, stack, router_spec: RouterSpec, kv_params_dir: str) -> str:
        Path(kv_params_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(router_spec.config_path), router_spec.config)
        router = ServerProcess(
            name="router",
            cmd=router_spec.command,
            env=router_spec.env,
            log_path=Path(router_spec.log_path),
            health_url=router_spec.health_url,
            grace_s=5.0,
        )
        stack.enter_context(router)
        router.wait_until_ready(60)
        self._procs.append((None, router))
        return router_spec.url

    def _warm_up(self, router_url: str, store: RunStore) -> None:
        """One short conversation before measuring, so that the first NIXL handshake between
        each P and D (both directions) is not charged to the first Point. Its records are
        kept in ``warmup/<deployment>.jsonl`` to show what the handshake costs."""

        dep = self.deployment
        flows = [p.flow for p in self.points]
        flow = (
            "pull"
            if Flow.pull in flows or Flow.decode_first in flows
            else ("recompute" if Flow.recompute in flows else "agg")
        )
        n = max(len(dep.by_role("prefill")) * len(dep.by_role("decode")), 1) * 2
        warm = WorkloadConfig(conversations=n, turns=2, user_tokens=32, output_tokens=0, seed=12345)
        specs = build_conversations(warm, 0, dep.model.vocab_size)
        opts = RequestOptions(router_url, served_model_name(dep), 4, flow, f"warmup-{time.time()}")

        async def go():
            import aiohttp  # lazy: ~0.4 s, on the allocation only (the driver imports jobs/)

            async with aiohttp.ClientSession() as session:
                await session.post(
                    f"{router_url}/pdbench/flow", json={"flow": flow, "tag": "warmup"}
                )
            return await LoadGenerator(opts, n, 0.0, 0).run(specs)

        t0 = time.perf_counter()
        records = run_client(go())
        took = time.perf_counter() - t0
        write_lines_atomic(
            store.root / "warmup" / f"{dep.deployment_id}.jsonl", [asdict(r) for r in records]
        )
        ok = sum(r.status == "ok" for r in records)
        print(f"[pdbench] warm-up ({flow}): {ok}/{len(records)} ok in {took:.1f} s", flush=True)

    def _measure(self, point: Point, urls, router_url, hosts, store: RunStore, label: str):
        dep = self.deployment
        started = time.time()
        result = PointResult(
            point_id=point.point_id,
            status=PointStatus.failed,
            error="",
            flow=point.flow.value,
            deployment=dep.record(),
            workload=point.workload_record(),
            hosts=hosts,
            launch_spec_file=str(store.launch_spec_path(dep.deployment_id).relative_to(store.root)),
            started_at=started,
        )
        records: list[RequestRecord] = []
        try:
            records, per_turn, totals, duration, result.router, kv = run_client(
                self._drive(point, urls, router_url, label)
            )
            result.summary = attribution.summarize(records, duration)
            result.by_turn = per_turn
            result.metrics = totals
            result.transfer = attribution.transfer_totals(totals)
            self._decode_bill(result, records, totals, kv)
            failed = result.summary.failed_requests
            result.status = PointStatus.ok if failed == 0 else PointStatus.failed
            if failed:
                first = next(r for r in records if r.status != "ok")
                result.error = f"{failed} of {len(records)} requests failed; first: {first.error}"
        except Exception as exc:  # the Point fails, the record says why
            result.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"
        self._check_transport(result)
        trace_dir = Path(self._ran.traces_dir)
        result.trace_files = sorted(
            str(p.relative_to(store.root)) for p in trace_dir.glob("*.jsonl")
        )
        dead = [p for _, p in self._procs if not p.alive()]
        if dead:
            tails = "\n".join(
                f"--- {p.name} ({p.log_path}):\n{log_tail(p.log_path, 20)}" for p in dead
            )
            result.status = PointStatus.failed
            result.error = (
                f"server(s) died during the point: {[p.name for p in dead]}\n{tails}\n"
                + result.error
            )
        result.finished_at = time.time()
        return result, records

    def _check_transport(self, result: PointResult) -> None:
        """Record which UCX transports moved KV and flag a slow path or a slow link."""

        transport = self.deployment.transport
        for inst in self._ran.instances:
            if inst.role == "mixed":
                continue
            used = transports_in_log(Path(inst.log_path))
            result.transport_used[inst.name] = used
            tls = inst.env.get("UCX_TLS", "")  # what the server ran with (its launch spec)
            if tcp_fallback(used["read"], tls):
                result.flags.append(
                    f"{inst.name}: KV reads went over {used['read']}: TCP, though UCX_TLS="
                    f"{tls or '(unset)'} does not name it; UCX found no faster path (check "
                    "UCX_TLS, GPUDirect RDMA, cuda_ipc)"
                )
        stalled = self._expired_prefill_leases(result.point_id)
        if stalled:
            result.flags.append(
                f"{stalled} prefill request(s) of this point had their KV lease expire before D "
                "read it (vLLM: 'Releasing expired KV blocks ... retrieved by 0'): D stalled, "
                "and their TTFT measures the stall, not the transfer"
            )
        t = result.transfer
        if t.failed:
            policy = self.deployment.server.kv_load_failure_policy
            then = {"recompute": "recomputed their blocks", "fail": "failed their requests"}
            result.flags.append(
                f"{t.failed:g} KV transfer(s) failed (vllm:nixl_num_failed_transfers); vLLM "
                f"{then[policy]} (server.kv_load_failure_policy={policy})"
            )
        if t.read_after_expiry:
            result.flags.append(
                f"{t.read_after_expiry:g} KV read(s) arrived after the owner's lease had expired "
                "(vllm:nixl_num_notifications_after_expiry): those requests may have used KV "
                "that was no longer theirs; check their outputs against agg"
            )
        expected = float(transport.expected_gb_s)
        if expected > 0 and t.seconds > 0 and t.bytes / t.seconds / 1e9 < 0.1 * expected:
            result.flags.append(
                f"KV moved at {t.bytes / t.seconds / 1e9:.2f} GB/s, under 10% of the "
                f"{expected:g} GB/s transport.expected_gb_s for {transport.name}"
            )

    def _expired_prefill_leases(self, point_id: str) -> int:
        """P requests of this Point whose blocks D never read before P's lease ran out."""
        needle = "Releasing expired KV blocks for request"
        count = 0
        for inst in self._ran.instances:
            if inst.role != "prefill":
                continue
            try:
                text = Path(inst.log_path).read_text(errors="replace")
            except OSError:
                continue
            count += sum(
                1
                for line in text.splitlines()
                if needle in line and point_id in line and "retrieved by 0" in line
            )
        return count

    async def _drive(self, point: Point, urls, router_url: str, label: str):
        import aiohttp  # lazy: ~0.4 s, on the allocation only (the driver imports jobs/)

        dep = self.deployment
        wl = point.workload
        names = list(urls)
        prefill_names = [i.name for i in dep.by_role("prefill")]
        serving = {
            Flow.agg: [dep.agg_instance.name],
            Flow.recompute: prefill_names,
            Flow.pull: prefill_names,
            Flow.decode_first: prefill_names + [i.name for i in dep.by_role("decode")],
        }[point.flow]
        specs = build_conversations(wl, point.history_tokens, dep.model.vocab_size)
        opts = RequestOptions(
            url=router_url,
            model=served_model_name(dep),
            output_tokens=wl.output_tokens,
            flow=point.flow.value,
            salt=point.point_id,
            timeout_s=wl.request_timeout_s,
        )
        gen = LoadGenerator(opts, wl.concurrency, wl.request_rate, wl.seed)
        per_turn: list = []
        totals: dict[str, dict[str, float]] = {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
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
                per_turn.append(attribution.turn_row(turn, wave, deltas, prefill_names, serving))
                ok = sum(r.status == "ok" for r in wave)
                print(f"[pdbench] {label} turn {turn}: {ok}/{len(wave)} ok", flush=True)

            # D's KV occupancy over the Point (and the TTL's tail: flow.kv_tail)
            tail_s = dep.flow.decoder_kv_blocks_ttl_s + 5.0 if dep.flow.kv_tail else 0.0
            decode = [i.name for i in dep.by_role("decode")]
            kv = await kv_sampler.start(session, urls, dep.flow.kv_sample_period_s, decode, tail_s)
            t0 = time.perf_counter()
            records = await gen.run(specs, on_wave_done=on_wave_done)
            duration = time.perf_counter() - t0
            if kv is not None:
                await kv.stop()
            async with session.get(f"{router_url}/pdbench/stats") as r:
                router_stats = await r.json()
        return records, per_turn, totals, duration, router_stats, kv

    def _decode_bill(self, result: PointResult, records, totals, kv) -> None:
        """The decode instances' bill (KV held over time, D's own ITL/TPOT) and the samples."""
        dep = self.deployment
        result.kv_timeline = kv.timeline if kv is not None else {}
        result.decode_bill = decode_bill.bill(
            records,
            result.kv_timeline,
            kv.blocks if kv is not None else {},
            kv.load_end_s if kv is not None else 0.0,
            totals,
            [i.name for i in dep.by_role("decode")],
            dep.server.block_size,
            dep.flow.decoder_kv_blocks_ttl_s,
            dep.bidirectional,
        )


def _raise_interrupted(signum, frame):
    raise JobInterrupted(f"signal {signum}")


__all__ = ["DeploymentJob", "ServerStartError"]
