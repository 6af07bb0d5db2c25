"""The transfer bench's task body: an owner (P, rank 0) and a reader (D, rank 1).

Both tasks walk the same cases (``BenchSpec``) in lockstep, one UCX_TLS variant at a time
(each variant gets fresh agents, since UCX reads UCX_TLS when an agent starts):

- the owner fills its KV buffer with the integrity pattern and publishes its agent;
- READ case: the reader pulls each D rank's share (poisoned buffer, one transfer, verify),
  then times ``warmup + iterations`` pulls of the timed D rank and writes the record;
- WRITE case: per D rank the reader poisons and says ``ready``, the owner pushes with a
  ``written`` notification, the reader verifies and answers ``verified``; the owner then
  times its pushes and writes the record;
- the case ends with ``done:<case>`` from the initiator; the reader says ``bye`` last.

UCX protocol tables (``UCX_PROTO_INFO=y``) go to ``<work_dir>/ucx/<role>.<pid>.log``; the
record names the transports they show for the agent and the operation. Records are handed to
``sink`` (the job writes them atomically); nothing here imports pdbench.
"""

from __future__ import annotations

import ctypes
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from connector.bench import kv_buffer
from connector.bench.nixl_peer import NixlPeer, PeerAborted, PeerInfo, node_name, publish_failure
from connector.bench_config import MemoryKind, XferOp
from connector.bench_plan import BenchCase, BenchSpec
from connector.bench_record import flag_reasons, gb_per_s, quantile
from connector.layout import BlockTransfer
from connector.ucx_proto import data_transports, parse_proto_info
from records.bench import TransferRecord

OWNER, READER = "owner", "reader"
Sink = Callable[[dict[str, Any]], None]


def log(message: str) -> None:
    print(f"[pdbench] {message}", flush=True)


@contextmanager
def env_vars(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables for the block's duration."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ucx_log_path() -> Path | None:
    """This process's UCX log file (``UCX_LOG_FILE`` with ``%p``/``%h`` expanded)."""
    pattern = os.environ.get("UCX_LOG_FILE")
    if not pattern:
        return None
    path = pattern.replace("%p", str(os.getpid())).replace("%h", socket.gethostname())
    return Path(path)


def flush_c_streams() -> None:
    """``fflush(NULL)``: UCX writes its log through a buffered C stream."""

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def transports_used(agent_name: str, op: XferOp) -> list[str]:
    """Transports UCX chose for ``op`` of agent ``agent_name``, from this process's log."""
    path = ucx_log_path()
    if path is None:
        return []
    flush_c_streams()
    if not path.exists():
        return []
    return data_transports(parse_proto_info(path.read_text(errors="replace")), agent_name, op.value)


def pick_device(memory: MemoryKind, rank: int) -> int:
    """CUDA device of this task (one per task when several are visible), 0 for DRAM."""
    if memory is not MemoryKind.VRAM:
        return 0
    import torch  # lazy: torch only on the allocation's tasks

    device = rank % max(1, torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


class BenchTask:
    """One task of the bench job; ``run()`` walks every variant and case."""

    def __init__(self, spec: BenchSpec, rank: int, work_dir: Path, job_id: str, sink: Sink):
        self.spec = spec
        self.rank = rank
        self.role = OWNER if rank == 0 else READER
        self.work_dir = Path(work_dir)
        self.job_id = job_id
        self.sink = sink
        self.host = node_name()
        self.peer_host = ""
        self._scratch = None
        self._memcpy: dict[int, float] = {}
        self.written = 0
        self.failed = 0

    def run(self) -> dict[str, Any]:
        if self.rank > 1:
            return {"rank": self.rank, "role": "idle"}
        ucx_env = {"UCX_PROTO_INFO": "y"}
        if not os.environ.get("UCX_LOG_FILE"):
            (self.work_dir / "ucx").mkdir(parents=True, exist_ok=True)
            ucx_env["UCX_LOG_FILE"] = str(self.work_dir / "ucx" / f"{self.role}.%h.%p.log")
        import torch  # lazy: torch only on the allocation's tasks

        torch.set_num_threads(1)  # a single-stream memcpy, like the single-stream transfer
        with env_vars({**ucx_env, **self.spec.env}):
            device = pick_device(self.spec.memory, self.rank)
            for v, tls in enumerate(self.spec.variants()):
                cases = [c for c in self.spec.cases if c.ucx_tls == tls]
                with env_vars({"UCX_TLS": tls} if tls else {}):
                    self._run_variant(v, cases, device)
        return {
            "rank": self.rank,
            "role": self.role,
            "records": self.written,
            "failed": self.failed,
        }

    # ---- one UCX_TLS variant ----
    def _run_variant(self, v: int, cases: list[BenchCase], device: int) -> None:
        spec = self.spec
        rdv = self.work_dir / "rendezvous" / self.job_id / f"v{v}"
        me, other = f"pdb-{self.role}-v{v}", f"pdb-{READER if self.role == OWNER else OWNER}-v{v}"
        nbytes = spec.owner_bytes() if self.role == OWNER else spec.reader_bytes()
        tls = os.environ.get("UCX_TLS", "")
        try:
            peer = NixlPeer(me, spec.memory, nbytes, spec.backends, device, spec.progress_thread)
        except Exception as exc:  # e.g. UCX_TLS leaves UCX no usable transport
            publish_failure(rdv, me, exc)
            self._fail_variant(cases, tls, exc)
            return
        try:
            if self.role == OWNER:
                kv_buffer.fill_pattern(peer.buffer)
            peer.publish(rdv)
            try:
                info: PeerInfo = peer.connect(rdv, other, spec.rendezvous_timeout_s)
            except PeerAborted as exc:
                self._fail_variant(cases, tls, exc)
                return
            self.peer_host = info.host
            log(
                f"{self.role} {me} on {self.host} paired with {other} on {info.host} "
                f"(UCX_TLS={tls or 'default'}, {nbytes / 2**20:.1f} MiB {spec.memory.value})"
            )
            for case in cases:
                if self.role == READER:
                    self._reader_case(peer, case, tls)
                else:
                    self._owner_case(peer, case, tls)
                peer.release_handles()
            if self.role == READER:
                peer.send("bye")
            else:
                peer.wait("bye", timeout_s=spec.step_timeout_s)
        except BaseException as exc:
            try:
                peer.send(f"abort:{type(exc).__name__}: {exc}")
            except Exception:  # the peer may be gone already
                pass
            raise
        finally:
            peer.close()

    # ---- cases ----
    def _reader_case(self, peer: NixlPeer, case: BenchCase, tls: str) -> None:
        c, timeout = case.index, self.spec.step_timeout_s
        if case.op is XferOp.WRITE:
            for r in case.d_ranks:
                xfer = self.spec.transfer(case, r, peer.device)
                kv_buffer.poison(peer.buffer)
                peer.send(f"ready:{c}:{r}")
                msg = peer.wait(f"written:{c}:{r}", f"done:{c}", timeout_s=timeout)
                if msg.startswith("done:"):
                    return  # the owner gave up on this case and recorded why
                ok = kv_buffer.verify(peer.buffer, xfer.local, xfer.remote)
                peer.send(f"verified:{c}:{r}:{int(ok)}")
            peer.wait(f"done:{c}", timeout_s=timeout)
            return
        merge = self.spec.merge_descriptors
        try:
            ok = True
            for r in case.d_ranks:
                xfer = self.spec.transfer(case, r, peer.device)
                kv_buffer.poison(peer.buffer)
                handle = peer.make_xfer("READ", xfer.local, xfer.remote, merge=merge)
                peer.run(handle, timeout)
                ok = kv_buffer.verify(peer.buffer, xfer.local, xfer.remote) and ok
            self._measure(peer, case, xfer, xfer.local, xfer.remote, ok, tls)
        except Exception as exc:
            self._record_failure(case, tls, exc)
        finally:
            peer.send(f"done:{c}")

    def _owner_case(self, peer: NixlPeer, case: BenchCase, tls: str) -> None:
        c, timeout = case.index, self.spec.step_timeout_s
        if case.op is XferOp.READ:
            peer.wait(f"done:{c}", timeout_s=timeout)
            return
        merge = self.spec.merge_descriptors
        try:
            ok = True
            for r in case.d_ranks:
                xfer = self.spec.transfer(case, r, peer.device)
                peer.wait(f"ready:{c}:{r}", timeout_s=timeout)
                notif = f"written:{c}:{r}".encode()
                handle = peer.make_xfer("WRITE", xfer.remote, xfer.local, notif, merge=merge)
                peer.run(handle, timeout)
                answer = peer.wait(f"verified:{c}:{r}:", timeout_s=timeout)
                ok = answer.endswith(":1") and ok
            self._measure(peer, case, xfer, xfer.remote, xfer.local, ok, tls)
        except Exception as exc:
            self._record_failure(case, tls, exc)
        finally:
            peer.send(f"done:{c}")

    def _measure(
        self,
        peer: NixlPeer,
        case: BenchCase,
        xfer: BlockTransfer,
        local: list[tuple[int, int, int]],
        remote: list[tuple[int, int, int]],
        integrity_ok: bool,
        tls: str,
    ) -> None:
        spec, timeout = self.spec, self.spec.step_timeout_s
        record = self._new_record(case, xfer, tls)
        made = time.perf_counter()
        handle = peer.make_xfer(case.op.value, local, remote, merge=spec.merge_descriptors)
        record.make_xfer_s = time.perf_counter() - made
        for _ in range(spec.warmup):
            peer.run(handle, timeout)
        times = [peer.run(handle, timeout) for _ in range(spec.iterations)]
        record.times_s = times
        record.median_s = quantile(times, 0.5)
        record.p90_s = quantile(times, 0.9)
        record.gb_s = gb_per_s(xfer.nbytes, record.median_s)
        record.memcpy_gb_s = self._memcpy_gb_s(peer, xfer.nbytes)
        record.backend = peer.backend_of(handle)
        record.nixl_desc_count = peer.desc_count(handle)
        record.ucx_transports = transports_used(peer.name, case.op)
        record.integrity_ok = integrity_ok
        record.flag_reasons = flag_reasons(
            gb_s=record.gb_s,
            memcpy_gb_s=record.memcpy_gb_s,
            expected_gb_s=spec.expected_gb_s,
            nbytes=xfer.nbytes,
            ratio=spec.flag_ratio,
            min_bytes=spec.flag_min_bytes,
            transports=record.ucx_transports,
            ucx_tls=tls,
            integrity_ok=integrity_ok,
        )
        record.flag = bool(record.flag_reasons)
        record.status = "ok"
        self._emit(record)
        flag = f"  FLAG {','.join(record.flag_reasons)}" if record.flag else ""
        log(
            f"case {case.index + 1}/{len(spec.cases)} {case.op.value} {case.layout.value} "
            f"{case.split} {case.tokens} tok: {xfer.nbytes / 2**20:.2f} MiB in "
            f"{xfer.descriptors} descs, {record.gb_s:.2f} GB/s (memcpy "
            f"{record.memcpy_gb_s:.2f}), {'+'.join(record.ucx_transports) or '?'}, "
            f"integrity {'ok' if integrity_ok else 'FAILED'}{flag}"
        )

    def _memcpy_gb_s(self, peer: NixlPeer, nbytes: int) -> float:
        """Local copy speed in the buffer's memory, at least ``memcpy_min_bytes`` long."""
        size = max(nbytes, self.spec.memcpy_min_bytes)
        if size not in self._memcpy:
            if self._scratch is None or self._scratch[0].numel() < size:
                self._scratch = None
                src = kv_buffer.allocate_like(peer.buffer, size)
                src.fill_(1)  # untouched pages would read as the shared zero page
                self._scratch = (src, kv_buffer.allocate_like(peer.buffer, size))
            src, dst = self._scratch
            self._memcpy[size] = kv_buffer.memcpy_gb_s(src, dst, size, self.spec.memcpy_iterations)
        return self._memcpy[size]

    # ---- records ----
    def _new_record(self, case: BenchCase, xfer: BlockTransfer, tls: str) -> TransferRecord:
        spec, shape = self.spec, self.spec.shape
        owner_host = self.host if self.role == OWNER else self.peer_host
        reader_host = self.host if self.role == READER else self.peer_host
        return TransferRecord(
            record_id=case.record_id,
            status="failed",
            model=spec.model,
            dtype=spec.dtype,
            num_layers=shape.num_layers,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype_bytes=shape.dtype_bytes,
            block_size=shape.block_size,
            layout=case.layout.value,
            tp_split=str(case.split),
            p_tp=case.split.p_tp,
            d_tp=case.split.d_tp,
            d_rank=xfer.d_rank,
            p_rank=xfer.p_rank,
            tokens=case.tokens,
            blocks=case.blocks,
            bytes=xfer.nbytes,
            bytes_per_block=xfer.bytes_per_block,
            descriptors=xfer.descriptors,
            descs_per_block=case.descs_per_block,
            merge_descriptors=spec.merge_descriptors,
            op=case.op.value,
            initiator=READER if case.op is XferOp.READ else OWNER,
            memory=spec.memory.value,
            block_order=spec.block_order.value,
            ucx_tls=tls,
            iterations=spec.iterations,
            warmup=spec.warmup,
            expected_gb_s=spec.expected_gb_s,
            host_owner=owner_host,
            host_reader=reader_host,
            started_at=time.time(),
        )

    def _fail_variant(self, cases: list[BenchCase], tls: str, exc: BaseException) -> None:
        """Record the cases this task initiates as failed: their agents never paired."""
        log(f"{self.role}: UCX_TLS={tls or 'default'} unusable: {type(exc).__name__}: {exc}")
        mine = XferOp.READ if self.role == READER else XferOp.WRITE
        for case in cases:
            if case.op is mine:
                self._record_failure(case, tls, exc)

    def _record_failure(self, case: BenchCase, tls: str, exc: BaseException) -> None:
        xfer = self.spec.transfer(case, case.timed_d_rank)
        record = self._new_record(case, xfer, tls)
        record.error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        self._emit(record)
        log(f"case {case.index + 1}/{len(self.spec.cases)} failed: {type(exc).__name__}: {exc}")

    def _emit(self, record: TransferRecord) -> None:
        self.sink(record.to_dict())
        if record.status == "ok":
            self.written += 1
        else:
            self.failed += 1


def run_bench_task(
    spec: BenchSpec, rank: int, work_dir: Path, job_id: str, sink: Sink
) -> dict[str, Any]:
    """Run this task's side of the bench (rank 0 owner, rank 1 reader, others idle)."""
    return BenchTask(spec, rank, work_dir, job_id, sink).run()
