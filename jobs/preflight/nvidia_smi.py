"""Parsers of ``nvidia-smi`` output (pure): the GPU query, the header, ``topo -m``.

``nvidia-smi topo -m`` prints a matrix: a header row naming device columns (``GPU0``...,
``NIC0``... or, from older drivers, the NIC names themselves such as ``mlx5_0``) followed by
affinity columns (``CPU Affinity``, ``NUMA Affinity``, ``GPU NUMA ID``); one row per device
whose cells are ``X`` (self), ``NV#`` (a bonded set of # NVLinks) or a PCIe path level
(``PIX`` < ``PXB`` < ``PHB`` < ``NODE`` < ``SYS``, nearest first); then a ``Legend`` and, on
newer drivers, a ``NIC Legend`` mapping ``NIC0: mlx5_0``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The query the preflight runs, in this column order.
GPU_QUERY = "index,uuid,name,memory.total,driver_version,pci.bus_id"
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_gib: float
    driver: str
    bus_id: str


def parse_gpu_query(text: str) -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 6 or not cells[0].isdigit():
            continue
        try:
            memory_mib = float(cells[3])
        except ValueError:
            memory_mib = 0.0
        gpus.append(
            GpuInfo(
                index=int(cells[0]),
                uuid=cells[1],
                name=cells[2],
                memory_gib=round(memory_mib / 1024, 1),
                driver=cells[4],
                bus_id=cells[5],
            )
        )
    return gpus


def parse_cuda_version(text: str) -> str:
    """``12.4`` from the header of plain ``nvidia-smi`` (``CUDA Version: 12.4``)."""
    match = re.search(r"CUDA Version:\s*([0-9.]+)", text)
    return match.group(1) if match else ""


@dataclass
class Topology:
    """``nvidia-smi topo -m``: links between GPUs and from GPUs to NICs."""

    gpus: list[str] = field(default_factory=list)  # GPU0, GPU1...
    nics: dict[str, str] = field(default_factory=dict)  # column name -> device (mlx5_0)
    cells: dict[tuple[str, str], str] = field(default_factory=dict)  # (row, column) -> cell
    cpu_affinity: dict[str, str] = field(default_factory=dict)  # GPU0 -> 0-55,112-167

    def link(self, a: int, b: int) -> str:
        """The cell between GPU ``a`` and GPU ``b`` (``NV18``, ``SYS``...); "" if unknown."""
        return self.cells.get((f"GPU{a}", f"GPU{b}"), "")

    def nvlinks(self, a: int, b: int) -> int:
        """Bonded NVLinks between two GPUs; 0 when they are linked over PCIe only."""
        match = re.fullmatch(r"NV(\d+)", self.link(a, b))
        return int(match.group(1)) if match else 0

    def nearest_nics(self, gpu: int) -> list[str]:
        """NIC devices at the nearest PCIe level from GPU ``gpu`` (``["mlx5_0"]``)."""
        levels = {
            device: self.cells.get((f"GPU{gpu}", column), "")
            for column, device in self.nics.items()
        }
        ranked = [(PCIE_LEVELS.index(lv), d) for d, lv in levels.items() if lv in PCIE_LEVELS]
        if not ranked:
            return []
        best = min(rank for rank, _ in ranked)
        return sorted(d for rank, d in ranked if rank == best)

    def nic_level(self, gpu: int, device: str) -> str:
        column = next((c for c, d in self.nics.items() if d == device), device)
        return self.cells.get((f"GPU{gpu}", column), "")


def parse_topology(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m``; a text without a matrix gives an empty Topology."""
    lines = text.splitlines()
    topo = Topology()
    header_at = next(
        (i for i, line in enumerate(lines) if re.match(r"^\s+GPU\d+\s", line + " ")), None
    )
    if header_at is None:
        return topo
    header = lines[header_at].split()
    columns = header[: header.index("CPU")] if "CPU" in header else header
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or line.strip().startswith("Legend"):
            break
        row = tokens[0]
        cells = tokens[1 : 1 + len(columns)]
        for column, cell in zip(columns, cells, strict=False):
            topo.cells[(row, column)] = cell
        if row.startswith("GPU"):
            topo.gpus.append(row)
            rest = tokens[1 + len(columns) :]
            if rest:
                topo.cpu_affinity[row] = rest[0]
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)\s*$", text, flags=re.M))
    for column in columns:
        if column.startswith("GPU"):
            continue
        topo.nics[column] = legend.get(column, column)
    return topo
