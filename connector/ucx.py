"""UCX transport names: what a ``UCX_TLS`` value allows, and what UCX says it has (pure).

The UCX knowledge of pdbench is in three modules of connector (the lowest layer, so that the
transfer bench, the jobs and validation share it): this one (names, aliases, the ``UCX_TLS``
grammar, the resources ``ucx_info -d`` and ``ucp_context_print_info`` list, which transports
can connect NIXL's endpoints), ``ucx_proto`` (which transports a log's ``UCX_PROTO_INFO``
tables say carried data, and whether that was a TCP fallback) and ``ucx_probe`` (a script
that loads the UCX NIXL's wheel bundles and prints its version and resources).

Three facts drive the rules built on this module (``validate_gpu``, ``preflight``):

- ``UCX_TLS`` takes transport names and aliases (``rc`` = ``rc_verbs`` + ``rc_mlx5``, ``sm``
  = the shared-memory transports, ``cuda`` = ``cuda_copy`` + ``cuda_ipc`` + ``gdr_copy``...),
  a leading ``^`` to exclude instead, ``all``, and ``:aux`` suffixes (wire-up only).
- UCX connects endpoints and NIXL sends its notifications with active messages (AM), and
  NIXL's UCX backend asks for peer-failure error handling: at least one allowed transport
  must carry AM *and* detect peer failure. ``cuda_ipc``/``cuda_copy`` carry no AM (UCX:
  "no active messages transport ... cuda_ipc/cuda - no am bcopy"), and the shared-memory
  transports have no peer-failure handler, so ``cuda_ipc,cuda_copy,sm,self`` cannot connect
  (NIXL #1413, the NIXL PR #1846 CI triage); ``tcp`` or an InfiniBand transport can.
- Two sources list the transports a node has: ``ucx_info -d`` (the system UCX, with
  capabilities) and ``ucp_context_print_info`` of the UCX that NIXL's wheel bundles
  (``connector.ucx_probe``: resources only). They need not be the same UCX version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# UCX_TLS aliases, as UCX documents them (ucx_info -f, UCX_TLS).
ALIASES: dict[str, tuple[str, ...]] = {
    "sm": ("posix", "sysv", "xpmem", "cma", "knem"),
    "shm": ("posix", "sysv", "xpmem", "cma", "knem"),
    "mm": ("posix", "sysv", "xpmem"),
    "rc": ("rc_verbs", "rc_mlx5"),
    "rc_v": ("rc_verbs",),
    "rc_x": ("rc_mlx5",),
    "ud": ("ud_verbs", "ud_mlx5"),
    "ud_v": ("ud_verbs",),
    "ud_x": ("ud_mlx5",),
    "dc": ("dc_mlx5",),
    "dc_x": ("dc_mlx5",),
    "ib": ("rc_verbs", "rc_mlx5", "ud_verbs", "ud_mlx5", "dc_mlx5"),
    "cuda": ("cuda_copy", "cuda_ipc", "gdr_copy"),
    "rocm": ("rocm_copy", "rocm_ipc", "rocm_gdr"),
}
# Transports that carry active messages and detect a failed peer: what NIXL's UCX endpoints
# need on at least one lane (``ucx_info -d``: am_bcopy + "error handling: peer failure").
AM_PEER_FAILURE_TRANSPORTS = frozenset(
    {"tcp", "rc_verbs", "rc_mlx5", "dc_mlx5", "ud_verbs", "ud_mlx5", "srd"}
)


def expand(names: list[str] | tuple[str, ...]) -> set[str]:
    """Transport names of a list of names and aliases (``rc`` -> rc_verbs, rc_mlx5)."""
    out: set[str] = set()
    for name in names:
        out.update(ALIASES.get(name, (name,)))
    return out


@dataclass(frozen=True)
class TlsSelection:
    """What a ``UCX_TLS`` value lets UCX use: every transport, or a list, or all but a list."""

    names: frozenset[str]  # expanded transport names
    exclude: bool  # True: every transport except ``names`` (``^...``, or "" / all)

    def allows(self, transport: str) -> bool:
        return (transport in self.names) != self.exclude


def parse_tls(spec: str) -> TlsSelection:
    """``UCX_TLS`` as UCX reads it; ``""`` (unset) and ``all`` allow every transport."""
    text = spec.strip()
    exclude = text.startswith("^")
    items = [item.split(":", 1)[0].strip() for item in text.lstrip("^").split(",")]
    items = [item for item in items if item]
    if not exclude and (not items or "all" in items):
        return TlsSelection(frozenset(), exclude=True)
    return TlsSelection(frozenset(expand(items)), exclude=exclude)


def named_for_data(spec: str) -> set[str]:
    """The transports a ``UCX_TLS`` value names for data, expanded: none for an exclusion
    (``^...``) or ``all``, and not those named for wire-up only (``tcp:aux``)."""
    text = spec.strip().lower()
    if text.startswith("^"):
        return set()
    items = [item.strip() for item in text.split(",")]
    return expand([item for item in items if item and ":" not in item and item != "all"])


def lacks_connectable_am(spec: str) -> bool:
    """True when ``UCX_TLS`` names no transport that both carries AM and detects peer
    failure: NIXL's UCX endpoints cannot connect (nor send notifications) with it."""
    selection = parse_tls(spec)
    return not any(selection.allows(t) for t in AM_PEER_FAILURE_TRANSPORTS)


@dataclass(frozen=True)
class UcxResource:
    """One transport on one device, as UCX lists it."""

    transport: str  # tcp, rc_mlx5, cuda_ipc, posix...
    device: str  # eth0, mlx5_0:1, cuda, memory...
    kind: str = ""  # network | intra-node | accelerator | loopback ("" when not listed)
    am: bool | None = None  # carries active messages (None: the source does not say)
    peer_failure: bool | None = None  # detects a failed peer (None: not said)

    @property
    def name(self) -> str:
        return f"{self.transport}/{self.device}"


_FIELD = re.compile(r"^#\s*([A-Za-z_ ]+?)\s*:\s*(.*)$")


def parse_ucx_info_devices(text: str) -> list[UcxResource]:
    """Resources of ``ucx_info -d`` output: one per "Transport:"/"Device:" pair, with
    whether it lists ``am_bcopy`` and "peer failure" in its error handling."""
    out: list[UcxResource] = []
    current: dict[str, object] | None = None

    def flush() -> None:
        if current and current.get("transport") and current.get("device"):
            out.append(
                UcxResource(
                    transport=str(current["transport"]),
                    device=str(current["device"]),
                    kind=str(current.get("kind", "")),
                    am=bool(current.get("am", False)),
                    peer_failure=bool(current.get("peer_failure", False)),
                )
            )

    for line in text.splitlines():
        match = _FIELD.match(line.strip())
        if not match:
            continue
        key, value = match.group(1).strip(), match.group(2).strip()
        if key in ("Memory domain", "Transport"):
            flush()
            current = {} if key == "Memory domain" else {"transport": value}
        elif current is None:
            continue
        elif key == "Device":
            if current.get("device"):  # a second device of the same transport
                flush()
                current = {"transport": current["transport"]}
            current["device"] = value
        elif key == "Type":
            current["kind"] = value
        elif key == "am_bcopy":
            current["am"] = True
        elif key == "error handling":
            current["peer_failure"] = "peer failure" in value
    flush()
    return out


_RESOURCE = re.compile(r"^#\s*resource\s+\d+\s*:.*?\s([A-Za-z0-9_]+)/(\S+)\s*$")


def parse_ucp_context_info(text: str) -> list[UcxResource]:
    """Resources of ``ucp_context_print_info`` output (``# resource 1 : md 1 dev 1 flags --
    tcp/eth0``): the transports a UCP context of that UCX build and environment uses."""
    out = []
    for line in text.splitlines():
        match = _RESOURCE.match(line.strip())
        if match:
            out.append(UcxResource(transport=match.group(1), device=match.group(2)))
    return out


def parse_ucx_version(text: str) -> str:
    """``1.13.1`` from ``ucx_info -v`` ("# Version 1.13.1" or "Library version: 1.20.0")."""
    match = re.search(r"[Vv]ersion:?\s*(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else ""


def matching(resources: list[UcxResource], expected: list[str]) -> list[UcxResource]:
    """The resources whose transport is one of ``expected`` (names or aliases)."""
    wanted = expand(expected)
    return [r for r in resources if r.transport in wanted]


def resources_of(names: list[str]) -> list[UcxResource]:
    """``transport/device`` names as UCX's protocol tables print them (``rc_mlx5/mlx5_0:1``,
    ``cma/memory``; ``connector.ucx_proto``) as resources."""
    return [
        UcxResource(*name.split("/", 1)) if "/" in name else UcxResource(name, "") for name in names
    ]


def unexpected_path(used: list[str], expected: list[str]) -> bool:
    """KV moved (``used`` not empty), but over none of the ``expected`` transports (names or
    aliases): a host-staged path, TCP, or a transport the config did not plan for."""
    return bool(expected) and bool(used) and not matching(resources_of(used), expected)


def connectable_am(resources: list[UcxResource]) -> list[UcxResource]:
    """Resources that carry AM with peer-failure handling (capabilities when the source
    lists them, else the transport's known kind)."""
    out = []
    for r in resources:
        if r.am is not None and r.peer_failure is not None:
            if r.am and r.peer_failure:
                out.append(r)
        elif r.transport in AM_PEER_FAILURE_TRANSPORTS:
            out.append(r)
    return out
