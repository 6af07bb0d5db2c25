"""The deployment job: runs on every task of the allocation.

Every task starts the vLLM servers placed on its node, waits for them to be healthy and
publishes their URLs in the run dir (rendezvous). Task 0 then starts the router and, for
each Point not yet recorded ``ok``, sets the flow, drives the load generator in turn waves,
scrapes every server's counters between waves and writes the PointResult. Every task tears
its servers down when task 0 is done, on error, on SIGTERM, or at the time limit.

Requeue: SLURM sends USR2 ``cluster.signal_delay_s`` before the time limit (or at a
preemption notice); submitit then pickles ``checkpoint()``'s answer (this job's fields: no
live process), requeues the job and exits. A SIGTERM (``scontrol requeue``, preemption,
``scancel``) tears down and exits without a result. Either way a Point cut short has no
record, and the requeued job (same job id, ``SLURM_RESTART_COUNT`` + 1) starts its servers
again and measures what is not recorded ``ok``: every Point once.
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
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import submitit

from connector.shared_files import poll_until
from connector.ucx_proto import tcp_fallback, transports_in_log
from jobs.measure import attribution, decode_bill, kv_sampler, metrics, ttft_split
from jobs.preflight.job import (
    PreflightFailed,
    node_preflight,
    read_reports,
    record_findings,
    reports_dir,
)
from jobs.serving.server import ServerProcess, ServerStartError, log_tail, wait_all_ready
from jobs.serving.server_log import LogWindow, expired_unread_leases, failed_loads, recomputed_loads
from jobs.slurm_env import TaskEnvironment
from jobs.tracking import make_tracker
from jobs.workload import LoadGenerator, RequestOptions, build_conversations, run_client
from pdbench.config.schema import Flow, TrackingConfig, WorkloadConfig
from pdbench.plan.deployments import Deployment, Point
from pdbench.results.store import (
    PointResult,
    PointStatus,
    RequestRecord,
    RunStore,
    write_json_atomic,
    write_lines_atomic,
)
from pdbench.spec.launch import (
    LOOPBACK,
    DeploymentSpec,
    InstanceSpec,
    RouterSpec,
    map_devices,
    resolve,
)
from pdbench.spec.serve_command import served_model_name
from pdbench.spec.ucx import expand, unexpected_path

KV_TAIL_MARGIN_S = 5.0  # flow.kv_tail samples D at most its TTL plus this after the load
RENDEZVOUS_TIMEOUT_S = 600.0  # how long task 0 waits for every node's servers


class NodeFailed(RuntimeError):
    """Another task of the job could not start its servers."""


class JobInterrupted(SystemExit):
    """SIGTERM reached the task (preemption, ``scontrol requeue``, ``scancel``): tear down and
    leave. A ``SystemExit`` so that no ``except Exception`` records it as a failed Point and
    submitit writes no error result: the driver keeps following a job SLURM requeues."""


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
        devices = os.environ.get("CUDA_VISIBLE_DEVICES")  # the GPUs SLURM gave this task
        store = RunStore(self.spec.run_dir)
        # A requeued job keeps its id: the restart count keeps its rendezvous apart.
        attempt = os.environ.get("SLURM_RESTART_COUNT", "0")
        self._attempt = (job_id, int(attempt or 0))
        if rank == 0 and self._attempt[1]:
            print(
                f"[pdbench] job {job_id} restarted by SLURM (restart {attempt}): servers start "
                "again, Points recorded ok are skipped",
                flush=True,
            )
        rdv = Path(self.spec.rendezvous_dir) / f"{job_id}.{attempt}"
        rdv.mkdir(parents=True, exist_ok=True)
        self._leaving = ""
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            with ExitStack() as stack:
                try:
                    self._procs: list[tuple[InstanceSpec | None, ServerProcess]] = []
                    if self.spec.preflight:
                        self._preflight(store, rank, rdv)
                    spec = map_devices(resolve(self.spec, {rank: host}), rank, devices)
                    urls = self._start_servers(stack, spec.on_node(rank), rank)
                    write_json_atomic(
                        rdv / f"node{rank}.json",
                        {
                            "host": host,
                            "hostname": socket.gethostname(),
                            "urls": urls,
                            "cuda_visible_devices": devices,
                        },
                    )
                    if rank != 0:
                        self._wait_for_rank0(rdv)
                        return {"rank": rank, "host": host}
                    nodes = self._gather_nodes(rdv)
                    # Every node's address and devices are known now: the spec as it ran.
                    ran = resolve(self.spec, nodes["addresses"])
                    for node, visible in nodes["devices"].items():
                        ran = map_devices(ran, node, visible)
                    write_json_atomic(store.launch_spec_path(ran.deployment_id), ran.to_dict())
                    return self._run_points(stack, store, ran, nodes["hosts"])
                except PreflightFailed as exc:
                    # Nothing was started: every pending Point carries the one line.
                    write_json_atomic(rdv / f"node{rank}.failed.json", {"error": str(exc)})
                    if rank == 0:
                        self._fail_pending(store, str(exc))
                    print(f"[pdbench] {exc}", flush=True)
                    raise
                except (ServerStartError, TimeoutError, NodeFailed) as exc:
                    # The deployment cannot run: every pending Point says why, in its record.
                    write_json_atomic(rdv / f"node{rank}.failed.json", {"error": str(exc)})
                    if rank == 0 and not self._leaving:
                        self._fail_pending(store, f"deployment did not start: {exc}")
                    raise
                finally:
                    if rank == 0:
                        write_json_atomic(rdv / "done.json", {"at": time.time()})
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _preflight(self, store: RunStore, rank: int, rdv: Path) -> None:
        """The job's first step on every node: check what the plan assumes before any
        server starts (``jobs.preflight.job``). Task 0 keeps every node's findings."""
        try:
            reports = node_preflight(self.spec, rank, rdv)
        except PreflightFailed as exc:
            if rank == 0:
                found = read_reports(reports_dir(rdv), self.spec.nodes)
                record_findings(store, self.spec.deployment_id, found, str(exc))
            raise
        if rank == 0:
            record_findings(store, self.spec.deployment_id, reports, "")

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
                repetition=point.repetition,
                order_index=point.order_index,
                started_at=time.time(),
                finished_at=time.time(),
                job_id=self._attempt[0],
                attempt=self._attempt[1],
            )
            store.write_point(result, [])

    def checkpoint(self, *args, **kwargs) -> submitit.helpers.DelayedSubmission:
        """What submitit pickles at USR2 (time limit near, or a preemption notice) before it
        requeues the job and exits: a copy of this job holding only its fields (``restart``),
        never the live servers (a lock in each ``Popen``: cannot be pickled). The requeue then
        SIGTERMs the job: from here that must not cut the teardown short."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._leaving = "time limit near or preemption notice (USR2)"
        # os.write, not print: a signal handler may interrupt a print (reentrant call).
        os.write(
            1,  # stdout: the job's log
            b"[pdbench] time limit near or preemption notice: checkpointed; the requeued job "
            b"starts the servers again and measures the Points not recorded ok\n",
        )
        return submitit.helpers.DelayedSubmission(self.restart())

    def _on_sigterm(self, signum, frame) -> None:
        """SIGTERM (preemption, ``scontrol requeue``, ``scancel``): leave. Raised here, where
        it interrupts a wait; an event loop callback may swallow it (uvloop logs it as a
        transport error), so ``_check_leaving`` raises it again before anything is recorded."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the teardown runs to its end
        self._leaving = f"signal {signum}"
        raise JobInterrupted(f"[pdbench] {self._leaving}: stopping the servers, leaving")

    def _check_leaving(self) -> None:
        """Leave (``JobInterrupted``) once a signal or the checkpoint said so: the Point in
        progress, cut short, is not recorded."""
        if self._leaving:
            raise JobInterrupted(
                f"[pdbench] {self._leaving}: the Point in progress is not recorded; stopping "
                "the servers, leaving"
            )

    def restart(self) -> DeploymentJob:
        """This job as submitted: the Deployment, its Points, the launch spec, no state."""
        return replace(self)

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
                cpus=inst.cpus,
            )
            stack.enter_context(proc)
            procs.append((inst, proc))
        took = wait_all_ready(
            [proc for _, proc in procs],
            self.deployment.server.startup_timeout_s,
            lambda line: print(f"[pdbench] {line}", flush=True),
        )
        for inst, proc in procs:
            print(
                f"[pdbench] {inst.name} healthy on {inst.host}:{inst.http_port} in "
                f"{took[proc.name]:.0f} s",
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
        devices: dict[int, str | None] = {}
        for node, f in enumerate(files):
            data = json.loads(f.read_text())
            addresses[node] = data["host"]
            devices[node] = data.get("cuda_visible_devices")
            for name in data["urls"]:
                hosts[name] = f"{data['hostname']} ({data['host']})"
        return {"hosts": hosts, "addresses": addresses, "devices": devices}

    # ---- points (task 0) ----
    def _run_points(self, stack, store: RunStore, ran: DeploymentSpec, hosts) -> dict[str, Any]:

        self._ran = ran
        urls = {inst.name: inst.url for inst in ran.instances}
        router_url = self._start_router(stack, ran.router)
        tracker = make_tracker(self.tracking, store.root, store.root.name)
        if any(store.point_status(p.point_id) is not PointStatus.ok for p in self.points):
            self._warm_up(router_url, store)
            self._check_leaving()
        done, failed, skipped = 0, 0, 0
        recorded = [
            p.point_id for p in self.points if store.point_status(p.point_id) is PointStatus.ok
        ]
        if recorded:
            print(
                f"[pdbench] skipping {len(recorded)} Point(s) recorded ok: {', '.join(recorded)}",
                flush=True,
            )
        # The order the launch spec holds (and the dry run printed): randomized blocks.
        position = {point_id: i for i, point_id in enumerate(ran.run_order)}
        points = sorted(self.points, key=lambda p: position.get(p.point_id, p.order_index))
        for i, point in enumerate(points, 1):
            self._check_leaving()
            if store.point_status(point.point_id) is PointStatus.ok:
                skipped += 1
                continue
            label = (
                f"[{i}/{len(self.points)}] {point.flow.value} h={point.history_tokens} "
                f"r={point.repetition}"
            )
            print(f"[pdbench] point {label} ({point.point_id})", flush=True)
            result, records = self._measure(point, urls, router_url, hosts, store, label)
            self._check_leaving()  # cut short: no record, the requeued job measures it
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

    def _start_router(self, stack, router_spec: RouterSpec) -> str:
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
        """Before measuring, one short two-turn conversation per (flow, history length) of
        the Points (one per P-D pair where there are several), so that neither the first NIXL
        handshakes between each P and D (both directions) nor the first run of a prompt
        length is charged to the first Point of a flow. Its records are kept apart, in
        ``warmup/<deployment>.jsonl``, to show what those first times cost."""

        dep = self.deployment
        cases = list(dict.fromkeys((p.flow, p.history_tokens) for p in self.points))
        n = max(len(dep.by_role("prefill")) * len(dep.by_role("decode")), 1)
        warm = WorkloadConfig(conversations=n, turns=2, user_tokens=32, output_tokens=4, seed=12345)
        model = served_model_name(dep)

        async def go():
            import aiohttp  # lazy: ~0.4 s, on the allocation only (the driver imports jobs/)

            records: list[RequestRecord] = []
            async with aiohttp.ClientSession() as session:
                for flow, history in cases:
                    tag = f"warmup-{flow.value}-h{history}-{time.time()}"
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
        write_lines_atomic(
            store.root / "warmup" / f"{dep.deployment_id}.jsonl", [asdict(r) for r in records]
        )
        ok = sum(r.status == "ok" for r in records)
        print(
            f"[pdbench] warm-up ({len(cases)} flow x history cases): {ok}/{len(records)} ok "
            f"in {took:.1f} s",
            flush=True,
        )

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
            repetition=point.repetition,
            order_index=point.order_index,
            hosts=hosts,
            launch_spec_file=str(store.launch_spec_path(dep.deployment_id).relative_to(store.root)),
            started_at=started,
            job_id=self._attempt[0],
            attempt=self._attempt[1],
        )
        records: list[RequestRecord] = []
        # This Point's stretch of the P/D servers' logs (every Point of a Deployment shares them).
        logs = LogWindow([i.log_path for i in self._ran.instances if i.role != "mixed"])
        try:
            records, per_turn, totals, duration, result.router, waves, kv = run_client(
                self._drive(point, urls, router_url, label)
            )
            self._split_ttft(records, per_turn, waves)
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
        stretch = logs.read()  # this Point's part of the P/D logs, read once
        self._check_transport(result, stretch)
        self._check_kv_loads(result, "".join(stretch.values()))
        self._check_handoff(result)
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

    def _split_ttft(self, records: list[RequestRecord], per_turn, waves) -> None:
        """Each request's TTFT in parts (jobs/measure/ttft_split.py), per turn their means."""
        servers = ttft_split.read_server_timing(
            self._ran.timing_dir, ttft_split.wanted_ids(records)
        )
        ttft_split.apply(records, servers, waves)
        for row in per_turn:
            attribution.add_split(row, [r for r in records if r.turn == row.turn])

    def _check_transport(self, result: PointResult, stretch: dict[str, str] | None = None) -> None:
        """Record which UCX transports moved KV (per instance, so far in the Deployment: UCX
        prints a path once per endpoint) and flag a TCP fallback, a path other than the one
        the transport config expects, or a slow link."""

        transport = self.deployment.transport
        expected = list(transport.expected_ucx_transports)
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
            moved = sorted(set(used["read"]) | set(used["write"]))
            if unexpected_path(moved, expected):
                result.flags.append(
                    f"{inst.name}: KV moved over {moved}, none of the transports "
                    f"{transport.name} expects ({', '.join(sorted(expand(expected)))}; "
                    "transport.expected_ucx_transports): its bandwidth is not that link's "
                    "(check UCX_TLS, the NICs and GPUDirect RDMA, or the transport config)"
                )
        prefill_logs = {i.log_path for i in self._ran.instances if i.role == "prefill"}
        stalled = sum(
            expired_unread_leases(text, result.point_id)
            for path, text in (stretch or {}).items()
            if path in prefill_logs
        )
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

    def _check_kv_loads(self, result: PointResult, log_text: str) -> None:
        """Flag the requests of this Point whose KV did not load (its stretch of the P/D
        logs): recomputed (``kv_load_failure_policy=recompute``: always a flag, their TTFT
        is a recompute, not a transfer) or failed."""
        recomputed = recomputed_loads(log_text)
        if recomputed:
            result.flags.append(
                f"{recomputed} request(s) recomputed KV that failed to load (vLLM: 'Recovered "
                "from KV load failure', kv_load_failure_policy=recompute): their TTFT measures "
                "a recompute, not a transfer"
            )
        failed = failed_loads(log_text)
        if failed:
            result.flags.append(
                f"{failed} request(s) failed because their KV did not load (vLLM: 'Failing ... "
                "due to KV load failure', kv_load_failure_policy=fail)"
            )

    def _check_handoff(self, result: PointResult) -> None:
        """Flag pull / decode-first turns whose D params never reached the router (from
        D's plugin, ``connector.kv_params_service``): their next turn recomputed the
        history instead of pulling it."""
        missing = int(result.router.get("missing_params", 0) or 0)
        if missing:
            result.flags.append(
                f"{missing} turn(s) got no KV params from D after they finished (router "
                "missing_params): the conversation's next turn recomputed its history instead "
                "of pulling it (check D's log for the pdbench KV-params service)"
            )

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
        waves: dict[int, ttft_split.WaveTiming] = {}  # the split's per-wave stand-in
        answering = (
            [dep.agg_instance.name]
            if point.flow is Flow.agg
            else [i.name for i in dep.by_role("decode")]
        )
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
                waves[turn] = ttft_split.WaveTiming.from_deltas(deltas, prefill_names, answering)
                ok = sum(r.status == "ok" for r in wave)
                print(f"[pdbench] {label} turn {turn}: {ok}/{len(wave)} ok", flush=True)

            # D's KV occupancy over the Point (and the TTL's tail: flow.kv_tail)
            tail_s = (
                dep.flow.decoder_kv_blocks_ttl_s + KV_TAIL_MARGIN_S if dep.flow.kv_tail else 0.0
            )
            decode = [i.name for i in dep.by_role("decode")]
            kv = await kv_sampler.start(session, urls, dep.flow.kv_sample_period_s, decode, tail_s)
            t0 = time.perf_counter()
            records = await gen.run(specs, on_wave_done=on_wave_done)
            duration = time.perf_counter() - t0
            if kv is not None:
                await kv.stop()
            async with session.get(f"{router_url}/pdbench/stats") as r:
                router_stats = await r.json()
        return records, per_turn, totals, duration, router_stats, waves, kv

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


__all__ = ["DeploymentJob", "ServerStartError"]
