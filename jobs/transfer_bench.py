"""The KV-shaped NIXL transfer bench: the job its two tasks run, and the driver submitting it.

``python -m pdbench +experiment=transfer_bench [model=llama3_8b] [cluster=slurm]`` calls
``run_transfer_bench(cfg)``: plan the sweep (pure), skip cases already recorded ``ok``,
submit one 2-node job (locally: 2 tasks on this machine), follow its progress, print the
GB/s table. Task 0 owns the KV buffer (P), task 1 reads it (D); ``connector.bench`` does the
measuring and each record lands in ``<run_dir>/transfer_bench/<record_id>.json``
(schema: ``connector.bench_record``). Logs, UCX protocol tables and the rendezvous files
sit under ``<run_dir>/logs/transfer_bench/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connector.bench_plan import BenchSpec, pending_cases, plan_bench
from connector.bench_record import format_table
from connector.layout import KVShape, dtype_nbytes
from pdbench.results import write_json_atomic

if TYPE_CHECKING:
    from pdbench.config import RunConfig

JOB_NAME = "pdbench-transfer-bench"
RECORDS_DIR = "transfer_bench"


def kv_shape(cfg: RunConfig) -> KVShape:
    """The KV geometry of ``cfg.model`` with ``cfg.server.block_size`` tokens per block."""
    model = cfg.model
    return KVShape(
        num_layers=int(model.num_layers),
        num_kv_heads=int(model.num_kv_heads),
        head_dim=int(model.resolved_head_dim),
        dtype_bytes=dtype_nbytes(model.dtype),
        block_size=int(cfg.server.block_size),
    )


def bench_spec(cfg: RunConfig) -> BenchSpec:
    """The whole sweep of ``cfg.bench`` for ``cfg.model`` and ``cfg.transport`` (pure)."""
    transport = cfg.transport
    return plan_bench(
        cfg.bench,
        model=str(cfg.model.name),
        dtype=str(cfg.model.dtype),
        shape=kv_shape(cfg),
        backends=list(transport.backends),
        default_ucx_tls=transport.ucx_tls,
        expected_gb_s=float(transport.expected_gb_s),
        env={str(k): str(v) for k, v in transport.env.items()},
    )


def records_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORDS_DIR


def load_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every transfer-bench record of a run, by file name."""
    out = []
    for path in sorted(records_dir(run_dir).glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def recorded_ok(run_dir: str | Path) -> set[str]:
    return {r["record_id"] for r in load_records(run_dir) if r.get("status") == "ok"}


def task_rank() -> tuple[int, str]:
    """(global rank, job id) from submitit's environment."""
    import submitit

    env = submitit.JobEnvironment()
    return env.global_rank, str(env.job_id)


@dataclass
class TransferBenchJob:
    """The submitit callable: every task runs it and takes its role from its rank."""

    spec: BenchSpec
    run_dir: str

    def __call__(self) -> dict[str, Any]:
        from connector.bench import run_bench_task

        rank, job_id = task_rank()
        out = records_dir(self.run_dir)

        def sink(record: dict[str, Any]) -> None:
            write_json_atomic(out / f"{record['record_id']}.json", record)

        work = Path(self.run_dir) / "logs" / RECORDS_DIR
        return run_bench_task(self.spec, rank, work, job_id, sink)


def describe(spec: BenchSpec) -> str:
    """One line per case: what a dry run prints."""
    lines = [
        f"transfer bench: {spec.model} ({spec.shape.num_layers} layers, "
        f"{spec.shape.num_kv_heads} KV heads, head_dim {spec.shape.head_dim}, {spec.dtype}, "
        f"block {spec.shape.block_size}: {spec.shape.bytes_per_token} B/token), "
        f"{spec.memory.value}, {len(spec.cases)} cases, owner buffer "
        f"{spec.owner_bytes() / 2**20:.1f} MiB, reader buffer {spec.reader_bytes() / 2**20:.1f} MiB"
    ]
    for c in spec.cases:
        lines.append(
            f"  {c.record_id}  {c.op.value:5} {c.layout.value} {c.split} "
            f"d/blk={c.descs_per_block} UCX_TLS={c.ucx_tls or 'default'} "
            f"{c.tokens} tok = {c.blocks} blocks"
        )
    return "\n".join(lines)


def run_transfer_bench(cfg: RunConfig) -> Path:
    """Plan, submit, follow and tabulate the transfer bench; the records' directory."""
    from pdbench.config import ExecutorKind
    from pdbench.executors import make_executor
    from pdbench.progress import follow

    out = records_dir(cfg.dir)
    spec = bench_spec(cfg)
    total = len(spec.cases)
    if cfg.launch.resume:
        spec = pending_cases(spec, recorded_ok(cfg.dir))
    print(describe(spec), flush=True)
    if total > len(spec.cases):
        print(f"  ({total - len(spec.cases)} of {total} cases already recorded ok: skipped)")
    if cfg.launch.dry_run or not spec.cases:
        if not spec.cases:
            print(format_table(load_records(cfg.dir)))
        return out
    if cfg.cluster.executor is ExecutorKind.debug:
        raise ValueError(
            "the transfer bench needs two tasks; cluster=debug runs one: "
            "use cluster=local or cluster=slurm"
        )
    folder = Path(cfg.dir) / "logs" / RECORDS_DIR / "submitit"
    executor = make_executor(cfg.cluster, folder, nodes=2, job_name=JOB_NAME)
    job = executor.submit(TransferBenchJob(spec, str(Path(cfg.dir).resolve())))
    print(
        f"[pdbench] submitted transfer bench job {job.job_id} ({len(spec.cases)} cases); "
        f"logs in {folder}",
        flush=True,
    )
    wanted = {c.record_id for c in spec.cases}

    def recorded() -> str:
        return f"{len(wanted & {r['record_id'] for r in load_records(cfg.dir)})}/{len(wanted)}"

    outcome = follow(job, recorded)
    error = outcome.get("error", "")
    records = load_records(cfg.dir)
    print(format_table(records), flush=True)
    print(f"records: {out}")
    if error:
        raise RuntimeError(f"transfer bench job {job.job_id} failed: {error}\n  logs: {folder}")
    return out
