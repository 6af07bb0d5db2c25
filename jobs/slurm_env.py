"""Role facts of the running task, read from the environment: rank, tasks, nodes, addresses.

Works under SLURM (``srun``/``sbatch``, with or without submitit), under submitit's
``LocalExecutor`` and ``DebugExecutor`` and in a plain process (one task, rank 0). Servers
bind to ``TaskEnvironment.address``: the address of this task's node as the cluster names it
(``SLURMD_NODENAME`` resolved through /etc/hosts or DNS).

A name that resolves to loopback (Debian's ``127.0.1.1 <hostname>`` line) would publish URLs
the other nodes cannot reach. On a multi-node SLURM job ``choose_node_address`` then takes
``PDBENCH_NODE_INTERFACE``'s address, else the default route's interface's, else the host's
only routable address, else fails with one line saying how to fix it. Loopback nodes stay
allowed only when asked for: ``PDBENCH_LOOPBACK_NODES=1`` (the local test cluster, whose
"nodes" are 127.0.10.x aliases of one host, sets it in conf/cluster/slurm.yaml).

Rank facts and node lists come from submitit's job environments (their variables and
their node-list parser); what submitit lacks is here: a plain process and SLURM's older
variables, a check of the node list's format, the node's address. ``expand_nodelist``,
``choose_node_address`` and ``parse_default_route`` are pure.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pdbench.spec.submitit_private import parse_node_list

# submitit's executor names (SUBMITIT_EXECUTOR); "none": not started by submitit.
EXECUTORS = ("slurm", "local", "debug", "none")
# "1": the job's nodes are aliases of one host; their loopback addresses are meant.
LOOPBACK_NODES_ENV = "PDBENCH_LOOPBACK_NODES"
# An interface name (ib0, eth1): servers bind to its IPv4 address on every node.
NODE_INTERFACE_ENV = "PDBENCH_NODE_INTERFACE"


_NODE_LIST = re.compile(r"^[^\[\],]+(\[[0-9,\-]+\][^\[\],]*)*$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a SLURM node list such as ``node[1-2],gpu-[01-03,07]``, in order
    (submitit's parser, as its job environments read ``SLURM_JOB_NODELIST``).

    Raises ``ValueError`` on malformed input, which submitit's parser lets through or
    answers with its own exception: unbalanced or nested brackets, bad or descending ranges.
    """
    text = nodelist.strip()
    groups = [g for g in re.split(r",(?![^\[]*\])", text) if g] if text else []
    for group in groups:
        if not _NODE_LIST.match(group):
            raise ValueError(f"unbalanced or nested brackets in node list {nodelist!r}")
        for ranges in re.findall(r"\[([^\]]*)\]", group):
            for item in ranges.split(","):
                match = _RANGE.match(item)
                if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
                    raise ValueError(f"bad range {item!r} in node list {nodelist!r}")
    return list(parse_node_list(text)) if text else []


def resolve_address(name: str) -> str:
    """IPv4 address of host ``name`` (``/etc/hosts`` or DNS); raises ``OSError`` if unknown."""
    return socket.gethostbyname(name)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


class NodeAddressError(OSError):
    """This node has no address the other nodes can reach; the message says how to fix it."""


@dataclass(frozen=True)
class AddressChoice:
    """The address servers of this node bind to, and why that one."""

    address: str
    how: str


def choose_node_address(
    node: str,
    resolved: str,
    multi_node: bool,
    interfaces: Mapping[str, list[str]],
    default_interface: str | None,
    allow_loopback: bool = False,
    interface: str = "",
) -> AddressChoice:
    """The address to publish for ``node`` (see the module docstring for the order).

    ``resolved`` is what the node name resolves to, ``interfaces`` the host's IPv4 addresses
    by interface, ``default_interface`` the interface of its default route.
    """
    routable = {
        name: [a for a in addrs if not is_loopback(a)] for name, addrs in interfaces.items()
    }
    if interface:
        if routable.get(interface):
            return AddressChoice(routable[interface][0], f"{NODE_INTERFACE_ENV}={interface}")
        have = ", ".join(sorted(n for n, a in routable.items() if a)) or "none"
        raise NodeAddressError(
            f"node {node}: {NODE_INTERFACE_ENV}={interface} but this host has no IPv4 address "
            f"on {interface} (interfaces with one: {have}). Fix: name one of those"
        )
    if not is_loopback(resolved):
        return AddressChoice(resolved, f"{node} resolves to it")
    if not multi_node:
        return AddressChoice(resolved, f"{node} resolves to it (loopback; a one-node job)")
    if allow_loopback:
        return AddressChoice(
            resolved, f"{node} resolves to it (loopback, allowed by {LOOPBACK_NODES_ENV}=1)"
        )
    if default_interface and routable.get(default_interface):
        return AddressChoice(
            routable[default_interface][0],
            f"{node} resolves to loopback {resolved}; {default_interface} has the default route",
        )
    candidates = [(n, a) for n, addrs in sorted(routable.items()) for a in addrs]
    if len(candidates) == 1:
        name, address = candidates[0]
        return AddressChoice(
            address, f"{node} resolves to loopback {resolved}; {name} has the only other address"
        )
    listed = ", ".join(f"{a} ({n})" for n, a in candidates) or "none"
    raise NodeAddressError(
        f"node {node} resolves to {resolved}, a loopback address the other nodes cannot reach, "
        f"and this host has no default route nor a single other address (found: {listed}). "
        f"Fix: map {node} to its network address in /etc/hosts or DNS, or set "
        f"cluster.env.{NODE_INTERFACE_ENV}=<interface>"
    )


def parse_default_route(route_table: str) -> str | None:
    """Interface of the IPv4 default route in ``/proc/net/route`` text; None if none."""
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "00000000" and int(fields[3], 16) & 0x1:
            return fields[0]
    return None


def default_route_interface() -> str | None:
    try:
        return parse_default_route(Path("/proc/net/route").read_text())
    except OSError:
        return None


def interface_addresses() -> dict[str, list[str]]:
    """IPv4 addresses of this host, by interface."""
    import psutil  # lazy: only when a node address must be chosen among interfaces

    return {
        name: [a.address for a in addrs if a.family == socket.AF_INET]
        for name, addrs in psutil.net_if_addrs().items()
    }


@dataclass(frozen=True)
class TaskEnvironment:
    """Who this task is within its job; ``from_environ()`` builds it from the environment."""

    executor: str  # one of EXECUTORS
    job_id: str
    global_rank: int
    local_rank: int
    num_tasks: int
    node_rank: int
    num_nodes: int
    node_name: str
    node_names: tuple[str, ...]
    hostname: str
    allow_loopback: bool = False  # PDBENCH_LOOPBACK_NODES=1
    interface: str = ""  # PDBENCH_NODE_INTERFACE

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> TaskEnvironment:
        """Read the role of this task. ``environ`` defaults to ``os.environ``.

        Rank facts come from submitit's ``JobEnvironment`` when a submitit executor started
        the task (it reads ``os.environ``), else from SLURM's own variables, else one task.
        """
        env = os.environ if environ is None else environ
        hostname = socket.gethostname()
        executor = env.get("SUBMITIT_EXECUTOR", "")
        if "SUBMITIT_DEBUG_JOB_ID" in env:
            executor = "debug"
        facts = None
        if executor and env is os.environ:
            facts = _submitit_facts()
        if facts is None:
            facts = _environ_facts(env, executor)
            if not executor:
                executor = "slurm" if "SLURM_JOB_ID" in env else "none"
        node_name = env.get("SLURMD_NODENAME") or hostname
        nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        node_names = tuple(expand_nodelist(nodelist)) if nodelist else (node_name,)
        return cls(
            executor=executor,
            node_name=node_name,
            node_names=node_names,
            hostname=hostname,
            allow_loopback=env.get(LOOPBACK_NODES_ENV, "").strip() == "1",
            interface=env.get(NODE_INTERFACE_ENV, "").strip(),
            **facts,
        )

    @property
    def is_slurm(self) -> bool:
        return self.executor == "slurm"

    @property
    def address(self) -> str:
        """The address servers of this task bind to (``address_choice`` says why)."""
        return self.address_choice.address

    @property
    def address_choice(self) -> AddressChoice:
        """This node's address as the cluster resolves it, unless that is a loopback address
        on a multi-node SLURM job (``choose_node_address``); raises ``NodeAddressError``."""
        resolved = self.node_address(self.node_name)
        multi_node = self.is_slurm and self.num_nodes > 1
        if not self.interface and not (multi_node and is_loopback(resolved)):
            return AddressChoice(resolved, f"{self.node_name} resolves to it")
        return choose_node_address(
            self.node_name,
            resolved,
            multi_node,
            interface_addresses(),
            default_route_interface(),
            allow_loopback=self.allow_loopback,
            interface=self.interface,
        )

    def node_address(self, name: str) -> str:
        """Address of node ``name``; off SLURM, falls back to this host, then to 127.0.0.1.

        Under SLURM an unresolvable node name is an error: binding elsewhere would make the
        servers unreachable from the other nodes.
        """
        try:
            return resolve_address(name)
        except OSError as err:
            if self.is_slurm:
                raise OSError(
                    f"cannot resolve SLURM node {name!r}: add it to /etc/hosts or DNS"
                ) from err
        try:
            return resolve_address(self.hostname)
        except OSError:
            return "127.0.0.1"

    @property
    def addresses(self) -> dict[str, str]:
        """Address of every node of the job, by node name."""
        return {name: self.node_address(name) for name in self.node_names}

    @property
    def is_rank_zero(self) -> bool:
        return self.global_rank == 0


def _submitit_facts() -> dict[str, object] | None:
    """Rank facts from ``submitit.JobEnvironment``; None when it cannot tell."""
    try:
        import submitit  # lazy: submitit only inside a submitit task

        job_env = submitit.JobEnvironment()
        return {
            "job_id": str(job_env.job_id),
            "global_rank": job_env.global_rank,
            "local_rank": job_env.local_rank,
            "num_tasks": job_env.num_tasks,
            "node_rank": job_env.node,
            "num_nodes": job_env.num_nodes,
        }
    except (ImportError, RuntimeError, KeyError):
        return None


def _environ_facts(env: Mapping[str, str], executor: str) -> dict[str, object]:
    """Rank facts straight from the variables submitit's job environments read (a plain
    process: one task, rank 0); SLURM's older ``SLURM_NPROCS``/``SLURM_NNODES`` too."""
    from submitit.local.local import LocalJobEnvironment  # lazy: submitit on the nodes only
    from submitit.slurm.slurm import SlurmJobEnvironment  # lazy: as above

    if executor == "debug":
        job_id = env.get("SUBMITIT_DEBUG_JOB_ID", "")
        return dict(
            job_id=job_id, global_rank=0, local_rank=0, num_tasks=1, node_rank=0, num_nodes=1
        )
    names = (LocalJobEnvironment if executor == "local" else SlurmJobEnvironment)._env
    job_id = env.get(names["job_id"], "")
    array_job, array_task = (
        env.get(names.get("array_job_id", "")),
        env.get(names.get("array_task_id", "")),
    )
    if array_job and array_task:
        job_id = f"{array_job}_{array_task}"
    return {
        "job_id": job_id,
        "global_rank": int(env.get(names["global_rank"], "0")),
        "local_rank": int(env.get(names["local_rank"], "0")),
        "num_tasks": int(env.get(names["num_tasks"]) or env.get("SLURM_NPROCS") or "1"),
        "node_rank": int(env.get(names["node"], "0")),
        "num_nodes": int(env.get(names["num_nodes"]) or env.get("SLURM_NNODES") or "1"),
    }
