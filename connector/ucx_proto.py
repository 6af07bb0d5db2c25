"""Which UCX transports carried KV, from UCX's protocol-selection tables (pure).

What UCX says it *did* (``UCX_PROTO_INFO`` tables in a log); what ``UCX_TLS`` allows and what
a node's UCX lists are ``connector.ucx``'s, and ``connector.ucx_probe`` asks the UCX that
NIXL's wheel bundles.

UCX picks transports silently; between GPUs a fallback to TCP costs ~100x (NIXL #791,
Dynamo #1072). The transfer bench's agents and the serving instances run with
``UCX_PROTO_INFO=y``; both read the tables here and judge them by one rule
(``tcp_fallback``).

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
from pathlib import Path

from connector.ucx import named_for_data, resources_of

_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*\[[^\]]*\]\s*")
_TRANSPORT = re.compile(r"\b([a-z][a-z0-9_]*/[A-Za-z0-9_:.\-]+)")
_TITLE = re.compile(r"^(\S+)\s+(self|intra-node|inter-node)\s+cfg#(\d+)$")
# Remote reads (NIXL READ: ucp_get*) and writes (WRITE: ucp_put*) are the data path; active
# messages (ucp_am*) carry notifications, and tables of an endpoint to itself are loopback.
_OPS = {"READ": "remote memory read", "WRITE": "remote memory write"}


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


def data_transports(tables: list[ProtoTable], context: str | None, op: str) -> list[str]:
    """Transports of ``op`` (``READ`` | ``WRITE``) between an agent and a peer (not itself):
    of UCP context ``context``, or of every context in the log when None."""
    prefix = _OPS[op]
    found: list[str] = []
    for table in tables:
        if context is not None and table.context != context:
            continue
        if table.scope == "self" or not table.operation.startswith(prefix):
            continue
        found += [t for t in table.transports if t not in found]
    return sorted(found)


def transports_in_log(path: Path) -> dict[str, list[str]]:
    """``{"read": [...], "write": [...]}``: what every NIXL agent of a server's log used."""
    try:
        tables = parse_proto_info(Path(path).read_text(errors="replace"))
    except OSError:
        tables = []
    return {op.lower(): data_transports(tables, None, op) for op in _OPS}


def tcp_fallback(transports: list[str], ucx_tls: str) -> bool:
    """TCP carried KV although ``UCX_TLS`` does not name it: UCX found no faster path (check
    UCX_TLS, GPUDirect RDMA, cuda_ipc). TCP asked for on purpose is not a fallback."""
    asked_tcp = "tcp" in named_for_data(ucx_tls)
    return not asked_tcp and any(r.transport == "tcp" for r in resources_of(transports))
