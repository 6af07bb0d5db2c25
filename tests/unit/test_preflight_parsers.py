"""nvidia-smi parsers on fixtures (written by hand: no GPU here; see fixtures/README.md)."""

from __future__ import annotations

import pytest

from jobs.preflight.nvidia_smi import parse_cuda_version, parse_gpu_query, parse_topology
from tests.unit.fixture_text import fixture

pytestmark = pytest.mark.unit


def test_gpu_query_rows():
    gpus = parse_gpu_query(fixture("nvidia_smi_query_h100_written.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_gib == 79.6
    assert gpus[7].driver == "550.54.15" and gpus[7].bus_id == "00000000:88:00.0"
    assert parse_gpu_query("") == []


def test_cuda_version_from_the_header():
    assert parse_cuda_version(fixture("nvidia_smi_header_written.txt")) == "12.4"
    assert parse_cuda_version("no header") == ""


def test_h100_topology_nvswitch_and_nearest_nics():
    topo = parse_topology(fixture("nvidia_smi_topo_h100_8gpu_written.txt"))
    assert topo.gpus == [f"GPU{i}" for i in range(8)]
    assert topo.link(0, 7) == "NV18" and topo.nvlinks(3, 4) == 18
    assert topo.nics == {f"NIC{i}": f"mlx5_{i}" for i in range(8)}
    assert topo.nearest_nics(0) == ["mlx5_0"] and topo.nearest_nics(5) == ["mlx5_5"]
    assert topo.nic_level(0, "mlx5_4") == "SYS" and topo.nic_level(0, "mlx5_1") == "NODE"
    assert topo.cpu_affinity["GPU4"] == "56-111,168-223"


def test_pcie_topology_without_nvlink_and_legacy_nic_columns():
    topo = parse_topology(fixture("nvidia_smi_topo_pcie_4gpu_written.txt"))
    assert topo.gpus == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert topo.link(0, 1) == "PIX" and topo.nvlinks(0, 1) == 0
    assert topo.link(1, 2) == "SYS"
    assert topo.nics == {"mlx5_0": "mlx5_0", "mlx5_1": "mlx5_1"}
    assert topo.nearest_nics(2) == ["mlx5_1"]


def test_no_matrix_is_an_empty_topology():
    assert parse_topology("NVIDIA-SMI has failed because it couldn't communicate").gpus == []
