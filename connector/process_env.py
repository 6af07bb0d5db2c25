"""Environment variables pdbench sets for the processes it starts, defined once.

pdbench's launch spec puts them in the servers' and the router's environment; connector's
vLLM plugin and tracer read them inside the servers (connector imports no pdbench module,
so the names live here, below both).
"""

from collections.abc import Mapping

RUN_DIR_ENV = "PDBENCH_RUN_DIR"  # marks every process pdbench starts for a run
KV_PARAMS_ADDR_ENV = "PDBENCH_KV_PARAMS_ADDR"  # host:port where D's plugin serves its KV params
TRACE_DIR_ENV = "PDBENCH_TRACE_DIR"  # where the tracer writes one line per transfer
TIMING_DIR_ENV = "PDBENCH_TIMING_DIR"  # where the plugin times each request (request_timing)
ROLE_ENV = "PDBENCH_ROLE"  # prefill | decode: traces name the direction (P<-D, D<-P)
# NIXL progress thread's poll timeout in microseconds (nixl_progress)
NIXL_PROGRESS_DELAY_ENV = "PDBENCH_NIXL_PROGRESS_DELAY_US"
CPU_DELAY_US = 1000  # CPU servers': 1 ms, the thread wakes at once when a socket is ready
# An engine's wait between steps while it only holds KV blocks for a peer, in ms (engine_idle)
ENGINE_IDLE_WAIT_ENV = "PDBENCH_ENGINE_IDLE_WAIT_MS"
CPU_WAIT_MS = 50  # CPU servers': 20 empty steps a second at most while only leases are held
# How vLLM starts a server's engine-core process: fork | spawn (engine_start)
ENGINE_START_ENV = "PDBENCH_ENGINE_START"
CPU_METHOD = "fork"  # what the launch spec sets for CPU servers
# The key the router requires of every client (Authorization: Bearer <key>; unset or "":
# none). Read from the driver's environment, which its jobs inherit; never in a record.
API_KEY_ENV = "PDBENCH_API_KEY"


# Each GPU's NIC (UCX_NET_DEVICES of a rank on it), ';'-separated by the GPU's number on the
# node: a TP rank's NIXL agent uses its own GPU's NIC (nic_for_device), not UCX's choice.
NIC_BY_GPU_ENV = "PDBENCH_NIC_BY_GPU"


def nics_text(nics_by_gpu: list[str] | tuple[str, ...]) -> str:
    """``transport.nics_by_gpu`` as ``NIC_BY_GPU_ENV``'s value."""
    return ";".join(nics_by_gpu)


def nic_for_device(by_gpu: str, visible: str | None, local: int) -> str:
    """The NIC of the GPU a process uses: its ``local`` CUDA device (an index into
    ``visible``, its ``CUDA_VISIBLE_DEVICES``) is GPU ``visible[local]`` of the node, whose
    entry of ``by_gpu`` (``NIC_BY_GPU_ENV``) names the NIC; "" where none is named."""
    nics = by_gpu.split(";") if by_gpu else []
    devices = [d.strip() for d in visible.split(",")] if visible else []
    device = devices[local] if 0 <= local < len(devices) else str(local)
    if not device.isdigit() or int(device) >= len(nics):
        return ""
    return nics[int(device)].strip()


def bearer(environ: Mapping[str, str]) -> dict[str, str]:
    """The header that carries ``API_KEY_ENV``'s key ({} when none is set)."""
    key = environ.get(API_KEY_ENV, "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def whole_number(environ: Mapping[str, str], name: str, give: str) -> int | None:
    """``environ[name]`` as a whole number, 0 or more; None when unset or blank. Anything
    else raises ValueError naming the variable and what to ``give`` ("the ... in whole
    milliseconds, 0 or more (0: ...)")."""
    given = environ.get(name, "").strip()
    if not given:
        return None
    try:
        value = int(given)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={given!r}: give {give}")
    return value
