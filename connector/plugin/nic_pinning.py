"""Each TP rank's NIXL agent on its own GPU's NIC (``transport.nics_by_gpu``).

UCX picks the network devices of each process itself (``UCX_NET_DEVICES`` unset: every
device it finds, ranked by its own estimate), which on a node of eight GPUs and eight NICs
need not be the NIC on the rank's PCIe switch (openucx #11259). Where the launch spec sets
``PDBENCH_NIC_BY_GPU`` (one NIC per GPU of the node), the plugin sets ``UCX_NET_DEVICES`` in
each worker process before vLLM's NIXL connector creates the worker's agent, to the NIC of
the GPU that worker runs on; the server log says which. Unset (the default), nothing changes.
"""

from __future__ import annotations

import logging
import os

from connector.process_env import NIC_BY_GPU_ENV, nic_for_device

logger = logging.getLogger("vllm.pdbench.nic")


def pin_nic(local_device: int | None) -> str:
    """Set this process's ``UCX_NET_DEVICES`` to its GPU's NIC; returns it ("" : unchanged).
    ``local_device``: the worker's CUDA device (None: no GPU, nothing to pin)."""
    by_gpu = os.environ.get(NIC_BY_GPU_ENV, "")
    if not by_gpu or local_device is None:
        return ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    nic = nic_for_device(by_gpu, visible, local_device)
    if nic:
        os.environ["UCX_NET_DEVICES"] = nic
        logger.info("pdbench: the rank on CUDA device %d uses NIC %s", local_device, nic)
    else:
        logger.warning(
            "pdbench: no NIC named for CUDA device %d (%s=%s, CUDA_VISIBLE_DEVICES=%s): "
            "UCX picks it",
            local_device,
            NIC_BY_GPU_ENV,
            by_gpu,
            visible,
        )
    return nic


def current_cuda_device() -> int | None:
    """The worker's CUDA device, None on a CPU build (no device to pin a NIC to)."""
    import torch  # lazy: the plugin's callers hold torch already; its import is slow

    return torch.cuda.current_device() if torch.cuda.is_available() else None
