"""The transfer bench on a GPU cluster measures the link it names: GPU memory, both tasks on
one node for NVLink and on two for RDMA, the sbatch script in its dry run; pdbench's tiny
model, whose few MiB time latency and not bandwidth, refused there."""

from __future__ import annotations

import pytest

from connector.bench_config import MemoryKind
from pdbench.config.compose import compose_job
from pdbench.driver.transfer_bench import run_transfer_bench
from pdbench.spec.transfer_bench import bench_memory, bench_placement, bench_spec
from pdbench.validate.rules import validate

pytestmark = pytest.mark.unit

GPU = ["+experiment=transfer_bench", "model=llama3_8b", "cluster=h100_8gpu", "launch.dry_run=true"]


def fields(cfg) -> dict[str, str]:
    return {p.field: p.message for p in validate(cfg)}


@pytest.mark.parametrize(
    ("transport", "nodes", "per_node"), [("nvlink", 1, 2), ("rdma", 2, 1), ("tcp", 2, 1)]
)
def test_a_gpu_clusters_bench_runs_in_vram_where_its_link_is(transport, nodes, per_node):
    cfg = compose_job([*GPU, f"transport={transport}"])
    assert bench_memory(cfg) is MemoryKind.VRAM and bench_spec(cfg).memory is MemoryKind.VRAM
    place = bench_placement(cfg)
    assert (place.nodes, place.tasks_per_node) == (nodes, per_node)
    assert "model" not in fields(cfg)  # the shape is enough: no weights to find


def test_the_dry_run_shows_memory_nodes_and_the_sbatch(tmp_path, capsys):
    for transport, lines in (
        ("nvlink", ("#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=2", "1 node, 2 tasks")),
        ("rdma", ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "2 nodes, 1 task each")),
    ):
        cfg = compose_job([*GPU, f"transport={transport}", f"dir={tmp_path / transport}"])
        run_transfer_bench(cfg)
        out = capsys.readouterr().out
        head = out.splitlines()[0]
        assert "llama3_8b" in head and "VRAM" in head
        assert all(line in out for line in lines), out[:2000]
        assert "#SBATCH --gpus-per-node=8" in out
        assert not (tmp_path / transport).exists()  # a dry run writes nothing


def test_cpu_runs_keep_host_memory_and_two_local_tasks():
    cfg = compose_job(["+experiment=transfer_bench"])
    assert bench_memory(cfg) is MemoryKind.DRAM
    assert (bench_placement(cfg).nodes, bench_placement(cfg).tasks_per_node) == (2, 1)
    explicit = compose_job([*GPU, "bench.memory=DRAM"])
    assert bench_memory(explicit) is MemoryKind.DRAM  # asked for: kept


def test_what_a_gpu_cluster_cannot_measure_is_refused_with_the_fix():
    tiny = fields(compose_job(["+experiment=transfer_bench", "cluster=h100_8gpu"]))
    assert "tiny generated model" in tiny["model"] and "4.0 MiB" in tiny["model"]
    one_gpu = [*GPU, "transport=nvlink", "cluster.gpus_per_node=1"]
    assert "one GPU each" in fields(compose_job(one_gpu))["cluster.gpus_per_node"]


def test_the_presets_table_line_validates_on_a_cpu_machine():
    """README's presets table: `+experiment=transfer_bench model=llama3_8b` on this machine.
    The bench starts no vLLM server, so the servers' memory checks (a 131k-token sequence in
    1 GiB of CPU KV cache, 2 x 15 GiB of weights) do not apply to it."""
    cfg = compose_job(["+experiment=transfer_bench", "model=llama3_8b"])
    assert validate(cfg) == [], [str(p) for p in validate(cfg)]
    assert fields(compose_job(["+experiment=smoke", "model=llama3_8b"]))  # servers: refused
