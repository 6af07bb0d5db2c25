"""Which UCX transports carried a transfer, from UCX's protocol-selection tables (pure).

With ``UCX_PROTO_INFO=y`` UCX logs, once per endpoint configuration, a table per operation::

    +--------+-------------+-----------------------------------+
    | pdb-reader-0 intra-node cfg#1                             |
    | remote memory read by ucp_get*(multi) into host memory from host |
    +--------+-------------+-----------------------------------+
    | Range  | Description |              Config               |
    +--------+-------------+-----------------------------------+
    | 0..inf | zero-copy   | cma/memory                        |
    +--------+-------------+-----------------------------------+

The first title word is the UCP context's name, which NIXL sets to the agent's name; the
Config column names ``transport/device`` pairs (``rc_mlx5/mlx5_0:1``, ``tcp/eth0``,
``cuda_ipc/cuda``, several per row when UCX splits lanes). NIXL's READ is ``ucp_get``, its
WRITE ``ucp_put``. Lines may carry UCX's ``[time] [host:pid:thread]`` log prefix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\[[^\]]*\]\s*")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*/[A-Za-z0-9_:.\-]+)")
_TITLE = re.compile(r"^(\S+)\s+(self|intra-node|inter-node)\s+cfg#(\d+)$")
_OPS = {"READ": "remote memory read by ucp_get", "WRITE": "remote memory write by ucp_put"}


@dataclass
class ProtoTable:
    context: str  # the UCP context (NIXL agent) name
    scope: str  # self | intra-node | inter-node
    operation: str
    transports: list[str] = field(default_factory=list)


def _cells(line: str) -> list[str] | None:
    line = _PREFIX.sub("", line).strip()
    if not line.startswith("|") or not line.endswith("|"):
        return None
    return [c.strip() for c in line[1:-1].split("|")]


def parse_proto_info(text: str) -> list[ProtoTable]:
    """Every protocol table in a UCX log, in order."""
    tables: list[ProtoTable] = []
    current: ProtoTable | None = None
    expect_operation = False
    for line in text.splitlines():
        cells = _cells(line)
        if cells is None:
            continue
        if len(cells) == 1:
            title = _TITLE.match(cells[0])
            if title:
                current = ProtoTable(title.group(1), title.group(2), "")
                tables.append(current)
                expect_operation = True
            elif current is not None and expect_operation:
                current.operation = cells[0]
                expect_operation = False
            continue
        expect_operation = False
        if current is None or len(cells) < 3 or cells[0] == "Range":
            continue
        for transport in _TRANSPORT.findall(cells[-1]):
            if transport not in current.transports:
                current.transports.append(transport)
    return tables


def data_transports(tables: list[ProtoTable], context: str, op: str) -> list[str]:
    """Transports of ``op`` (``READ`` | ``WRITE``) between ``context`` and a peer (not self)."""
    prefix = _OPS[op]
    found: list[str] = []
    for table in tables:
        if table.context != context or table.scope == "self":
            continue
        if not table.operation.startswith(prefix):
            continue
        found += [t for t in table.transports if t not in found]
    return sorted(found)
