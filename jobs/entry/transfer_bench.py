"""The KV-shaped NIXL transfer bench: the job its two tasks run, and its sweep (pure).

``python -m pdbench +experiment=transfer_bench [model=llama3_8b] [cluster=slurm]`` goes
through ``pdbench.driver.transfer_bench``: validated and submitted like every launch, one
2-node job (locally: 2 tasks on this machine). Task 0 owns the KV buffer (P), task 1 reads it
(D); ``connector.bench.runner`` does the measuring and each record lands in
``<run_dir>/transfer_bench/<record_id>.json`` (schema: ``connector.bench_record``). Logs, UCX
protocol tables and the rendezvous files sit under ``<run_dir>/logs/transfer_bench/``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from connector.bench_plan import BenchSpec
from pdbench.results.store import write_json_atomic
from pdbench.spec.transfer_bench import bench_spec, kv_shape
from records import read
from records.bench import TransferRecord
from records.read import RecordError

__all__ = ["bench_spec", "kv_shape"]  # the sweep's builders, where the driver finds the job

JOB_NAME = "pdbench-transfer-bench"
RECORDS_DIR = "transfer_bench"


def submitit_folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / "logs" / RECORDS_DIR / "submitit"


def records_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORDS_DIR


def load_records(run_dir: str | Path) -> list[TransferRecord]:
    """Every transfer-bench record of a run, by file name (one that does not read back as a
    record is left out: its case runs again)."""
    out = []
    for path in sorted(records_dir(run_dir).glob("*.json")):
        try:
            out.append(read.bench_record(json.loads(path.read_text()), str(path)))
        except (OSError, json.JSONDecodeError, RecordError):
            continue
    return out


def recorded_ok(run_dir: str | Path) -> set[str]:
    return {r.record_id for r in load_records(run_dir) if r.status == "ok"}


def task_rank() -> tuple[int, str]:
    """(global rank, job id) from submitit's environment."""
    env = submitit.JobEnvironment()
    return env.global_rank, str(env.job_id)


@dataclass
class TransferBenchJob:
    """The submitit callable: every task runs it and takes its role from its rank."""

    spec: BenchSpec
    run_dir: str

    def __call__(self) -> dict[str, Any]:
        rank, job_id = task_rank()
        out = records_dir(self.run_dir)

        def sink(record: dict[str, Any]) -> None:
            write_json_atomic(out / f"{record['record_id']}.json", record)

        from connector.bench.runner import (
            run_bench_task,
        )  # lazy: node runtime, loaded on the allocation only

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
