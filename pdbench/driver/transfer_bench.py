"""``python -m pdbench +experiment=transfer_bench``: the KV-shaped NIXL transfer bench as a
job of its own (``jobs.entry.transfer_bench``): planned, resumed, submitted and followed like a
run, its records tabulated at the end."""

from __future__ import annotations

from pathlib import Path

from connector.bench_plan import pending_cases
from connector.bench_record import format_table
from jobs.entry import transfer_bench
from pdbench.config.schema import ExecutorKind, RunConfig
from pdbench.driver.submit import check_slurm_reachable, follow, submit
from pdbench.spec.sbatch import sbatch_script
from pdbench.spec.transfer_bench import bench_placement


def run_transfer_bench(cfg: RunConfig) -> Path:
    """Plan, submit, follow and tabulate the transfer bench (``command=transfer_bench``).
    Returns the records' directory."""
    out = transfer_bench.records_dir(cfg.dir)
    spec = transfer_bench.bench_spec(cfg)
    total = len(spec.cases)
    if cfg.launch.resume:
        spec = pending_cases(spec, transfer_bench.recorded_ok(cfg.dir))
    place = bench_placement(cfg)
    gpus = cfg.cluster.gpus_per_node > 0
    head, *cases = transfer_bench.describe(spec).splitlines()
    print(head)
    print(f"  on {place.describe(gpus)} ({cfg.transport.name}; cluster {cfg.cluster.name})")
    print("\n".join(cases), flush=True)
    if total > len(spec.cases):
        print(f"  ({total - len(spec.cases)} of {total} cases already recorded ok: skipped)")
    if cfg.launch.dry_run and cfg.cluster.executor is ExecutorKind.slurm:
        folder = transfer_bench.submitit_folder(cfg.dir)
        script = sbatch_script(
            cfg.cluster, place.nodes, transfer_bench.JOB_NAME, folder,
            tasks_per_node=place.tasks_per_node,
        )  # fmt: skip
        print("  sbatch script:\n" + "\n".join(f"    {line}" for line in script.splitlines()))
    if cfg.launch.dry_run or not spec.cases:
        if not spec.cases:
            print(format_table(transfer_bench.load_records(cfg.dir)))
        return out
    if cfg.cluster.executor is ExecutorKind.debug:
        raise ValueError(
            "the transfer bench needs two tasks; cluster=debug runs one: "
            "use cluster=local or cluster=slurm"
        )
    if cfg.cluster.executor is ExecutorKind.slurm:
        check_slurm_reachable()
    folder = transfer_bench.submitit_folder(cfg.dir)
    job = transfer_bench.TransferBenchJob(spec, str(Path(cfg.dir).resolve()))
    label = f"transfer bench ({len(spec.cases)} cases; logs in {folder})"
    submitted = submit(
        cfg.cluster,
        folder,
        place.nodes,
        transfer_bench.JOB_NAME,
        [(label, job)],
        tasks_per_node=place.tasks_per_node,
    )
    wanted = {c.record_id for c in spec.cases}

    def recorded() -> str:
        done = {r.record_id for r in transfer_bench.load_records(cfg.dir)}
        return f"{len(wanted & done)}/{len(wanted)}"

    (outcome,) = follow(submitted, recorded)
    print(format_table(transfer_bench.load_records(cfg.dir)), flush=True)
    print(f"records: {out}")
    if outcome.failed:
        raise RuntimeError(
            f"transfer bench job {outcome.job_id} failed: {outcome.error}\n  logs: {folder}"
        )
    return out
