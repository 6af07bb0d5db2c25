"""The transfer preflight's processes: one KV-shaped NIXL read from P's device to D's.

``run_transfer`` runs on each node of the preflight after its other checks. The node that
holds P's device starts the owner process, the node that holds D's reads (one node may do
both): each is ``python -m jobs.preflight.transfer_side``, one side of a one-case transfer bench
(``connector.bench.runner``, ``pdbench.spec.transfer_probe.bench_spec``), so the job's own process
never opens a CUDA context or a NIXL agent before its servers start. The two sides meet
through files in the preflight's directory of this job attempt (shared by every node); a
side that cannot take part says so there, so the other stops waiting. The reader's record
becomes the node's ``transfer`` check and findings (``checks.check_transfer``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from connector.bench.nixl_peer import publish_failure
from connector.bench.runner import OWNER, READER
from connector.process_env import nic_for_device, nics_text
from connector.shared_files import write_json_atomic
from jobs.preflight.checks import check_transfer, transfer_findings
from pdbench.results.preflight import CheckResult
from pdbench.spec.launch import task_devices
from pdbench.spec.transfer_probe import TransferProbe
from records import read
from records.read import RecordError

JOB_ID = "preflight"  # connector.bench.runner's rendezvous: <work>/rendezvous/<job id>/v0
RECORD = "record.json"  # the reader's record
START_S = 120.0  # on top of the probe's timeouts: each side's interpreter, torch, NIXL


def agent_name(role: str) -> str:
    """``connector.bench.runner``'s agent of ``role`` for the first (only) UCX_TLS variant."""
    return f"pdb-{role}-v0"


def roles_on(probe: TransferProbe, rank: int) -> list[str]:
    """The sides of the read node ``rank`` runs: owner (P's node), reader (D's node)."""
    return [
        r for r, node in ((OWNER, probe.owner_node), (READER, probe.reader_node)) if node == rank
    ]


def device_env(probe: TransferProbe, role: str, visible: str | None) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of one side: the plan's GPU, mapped through the task's devices,
    and that GPU's NIC where ``transport.nics_by_gpu`` names one; {} for host memory."""
    gpu = probe.owner_gpu if role == OWNER else probe.reader_gpu
    if gpu < 0:
        return {}
    devices = task_devices(visible)
    device = devices[gpu] if gpu < len(devices) else str(gpu)
    env = {"CUDA_VISIBLE_DEVICES": device}
    nic = nic_for_device(nics_text(probe.nics_by_gpu), device, 0)
    if nic:
        env["UCX_NET_DEVICES"] = nic
    return env


def run_transfer(
    probe: TransferProbe | None,
    rank: int,
    work: Path,
    python: str,
    env: dict[str, str],
    healthy: bool = True,
) -> tuple[CheckResult | None, dict | None]:
    """This node's part of the read: (its check, the findings) on the reader's node; on the
    owner's node alone (its side's check, None); (None, None) where the node takes no part or
    its own checks failed already (the peer is told, so it does not wait)."""
    if probe is None:
        return (check_transfer(None, None), None) if rank == 0 else (None, None)
    roles = roles_on(probe, rank)
    rdv = Path(work) / "rendezvous" / JOB_ID / "v0"
    if not roles:
        return None, None
    if not healthy:
        for role in roles:
            publish_failure(rdv, agent_name(role), RuntimeError(f"node{rank} failed its checks"))
        return None, None
    work.mkdir(parents=True, exist_ok=True)
    probe_file = work / "probe.json"
    write_json_atomic(probe_file, probe.to_dict())
    (work / RECORD).unlink(missing_ok=True)
    errors = {}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for role in roles:
            child_env = {**env, **device_env(probe, role, env.get("CUDA_VISIBLE_DEVICES"))}
            argv = [python, "-m", "jobs.preflight.transfer_side", str(probe_file), role, str(work)]
            with open(work / f"{role}.log", "ab") as log:
                try:
                    procs[role] = subprocess.Popen(
                        argv,
                        env=child_env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                except OSError as err:
                    errors[role] = f"{role} side: {python} did not start ({err.strerror or err})"
                    publish_failure(rdv, agent_name(role), RuntimeError(errors[role]))
        for role, proc in procs.items():
            try:
                code = proc.wait(timeout=3 * probe.timeout_s + START_S)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                tail = (work / f"{role}.log").read_text(errors="replace").strip().splitlines()
                why = "timed out" if code is None else f"exited {code}"
                errors[role] = f"{role} side: its process {why}: {tail[-1] if tail else ''}"
                publish_failure(rdv, agent_name(role), RuntimeError(errors[role]))
    finally:  # a side still running (a timeout, the job's own teardown) is stopped here
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    if READER not in roles:
        return (
            check_transfer(probe, transfer_findings(probe, None, errors[OWNER]))
            if OWNER in errors
            else check_transfer(probe, None)
        ), None
    try:
        record = read.bench_record(json.loads((work / RECORD).read_text()), RECORD)
    except (OSError, json.JSONDecodeError, RecordError):
        record = None
    error = "" if record else "; ".join(errors.values()) or "the reader wrote no record"
    found = transfer_findings(probe, record, error)
    return check_transfer(probe, found), found
