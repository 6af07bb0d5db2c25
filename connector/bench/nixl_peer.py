"""One NIXL agent with one registered KV buffer, paired with a peer through files.

Rendezvous (``connector.shared_files.Rendezvous``): each side writes its agent metadata and
buffer address into a shared directory (the run dir, on the cluster's shared file system)
and waits for the peer's, with a timeout; a side that could not start says so there. After
that the two talk through NIXL notifications only (``send`` / ``wait``), which also carry a
failing side's ``abort:`` so the other does not wait out its timeout.

torch and nixl are imported when a peer is created, never at module import.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector.bench_config import MemoryKind
from connector.shared_files import PeerFailed, Rendezvous, poll_until


class PeerAborted(RuntimeError):
    """The peer reported a failure and stopped."""


@dataclass(frozen=True)
class PeerInfo:
    name: str
    host: str
    base: int
    nbytes: int
    device: int
    memory: str


def node_name() -> str:
    """The SLURM node this task runs on (several "nodes" may share a host), else the host."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def allocate(memory: MemoryKind, nbytes: int, device: int):
    """A zeroed uint8 torch tensor of ``nbytes`` in host memory or on CUDA ``device``."""
    import torch  # lazy: torch only on the allocation's tasks

    if memory is MemoryKind.VRAM:
        if not torch.cuda.is_available():
            raise RuntimeError("bench.memory=VRAM but CUDA is not available on this node")
        return torch.zeros(max(nbytes, 1), dtype=torch.uint8, device=f"cuda:{device}")
    return torch.zeros(max(nbytes, 1), dtype=torch.uint8)


def publish_failure(rdv: Path, name: str, error: BaseException) -> None:
    """Tell a peer waiting in ``connect`` that agent ``name`` will not come."""
    Rendezvous(rdv).publish_failure(name, f"{type(error).__name__}: {error}")


class NixlPeer:
    """A NIXL agent owning one registered buffer; ``close()`` releases everything."""

    def __init__(
        self,
        name: str,
        memory: MemoryKind,
        nbytes: int,
        backends: tuple[str, ...],
        device: int = 0,
        progress_thread: bool = False,
    ) -> None:
        from nixl._api import nixl_agent, nixl_agent_config  # lazy: nixl on tasks only

        self.name = name
        self.memory = memory
        self.device = device
        self.buffer = allocate(memory, nbytes, device)
        self.base = int(self.buffer.data_ptr())
        self.nbytes = int(self.buffer.numel())
        config = nixl_agent_config(
            enable_prog_thread=progress_thread, backends=list(backends), capture_telemetry=True
        )
        self.agent = nixl_agent(name, config)
        missing = [b for b in backends if b not in self.agent.backends]
        if missing:
            raise RuntimeError(
                f"NIXL backends {missing} are not available here "
                f"(plugins: {self.agent.get_plugin_list()})"
            )
        self._reg = self.agent.register_memory([(self.base, self.nbytes, device, "")], memory.value)
        self.peer: PeerInfo | None = None
        self._inbox: list[str] = []
        self._handles: list[Any] = []

    # ---- rendezvous ----
    def publish(self, rdv: Path) -> None:
        """Write this agent's metadata, then its description (the peer polls for the latter)."""
        meeting = Rendezvous(rdv)
        meeting.publish(f"{self.name}.md", self.agent.get_agent_metadata())
        info = PeerInfo(
            self.name, node_name(), self.base, self.nbytes, self.device, self.memory.value
        )
        meeting.publish_json(f"{self.name}.json", info.__dict__)

    def connect(self, rdv: Path, peer_name: str, timeout_s: float) -> PeerInfo:
        """Wait for the peer's files, load its agent; ``PeerAborted`` if it could not start."""
        meeting = Rendezvous(rdv)
        try:
            found = meeting.wait(
                [f"{peer_name}.json"],
                timeout_s,
                f"NIXL peer {peer_name}",
                failures=[peer_name],
                max_pause_s=0.05,
            )
        except PeerFailed:
            raise PeerAborted(
                f"peer {peer_name} did not start: {meeting.failure(peer_name)}"
            ) from None
        info = PeerInfo(**found[f"{peer_name}.json"])
        remote = self.agent.add_remote_agent(meeting.path(f"{peer_name}.md").read_bytes())
        remote = remote.decode() if isinstance(remote, bytes) else remote
        if remote != peer_name:
            raise RuntimeError(f"rendezvous file of {peer_name} holds agent {remote!r}")
        self.peer = info
        return info

    # ---- transfers ----
    def make_xfer(
        self,
        op: str,
        local: list[tuple[int, int, int]],
        remote: list[tuple[int, int, int]],
        notif: bytes = b"",
        merge: bool = True,
    ):
        """A reusable transfer handle from buffer-relative descriptor lists.

        ``merge=False`` keeps NIXL from merging descriptors adjacent on both sides.
        """
        import numpy as np  # lazy: numpy only when a transfer is prepared

        assert self.peer is not None, "connect() first"
        loc = np.asarray(local, dtype=np.uint64).reshape(-1, 3)
        rem = np.asarray(remote, dtype=np.uint64).reshape(-1, 3)
        loc[:, 0] += np.uint64(self.base)
        rem[:, 0] += np.uint64(self.peer.base)
        loc[:, 2] = self.device  # each side's own GPU (0 for DRAM)
        rem[:, 2] = self.peer.device
        mem = self.memory.value
        local_side = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", loc, mem)
        remote_side = self.agent.prep_xfer_dlist(self.peer.name, rem, mem)
        self._handles += [local_side, remote_side]
        idx = np.arange(len(loc), dtype=np.int32)
        extra = {} if merge else {"skip_desc_merge": True}
        handle = self.agent.make_prepped_xfer(op, local_side, idx, remote_side, idx, notif, **extra)
        self._handles.append(handle)
        return handle

    def run(self, handle, timeout_s: float) -> float:
        """Post ``handle`` and spin until it completes; the seconds it took."""
        agent = self.agent
        deadline = time.monotonic() + timeout_s
        start = time.perf_counter()
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
            if time.monotonic() > deadline:
                raise TimeoutError(f"transfer still in progress after {timeout_s:.0f} s")
        elapsed = time.perf_counter() - start
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer failed (state {state})")
        return elapsed

    def backend_of(self, handle) -> str:
        try:
            return str(self.agent.query_xfer_backend(handle))
        except Exception:  # informational only
            return ""

    def desc_count(self, handle) -> int:
        """Descriptors NIXL posted for ``handle`` after merging (telemetry), -1 if unknown."""
        try:
            return int(self.agent.get_xfer_telemetry(handle).descCount)
        except Exception:  # telemetry is optional
            return -1

    # ---- messages ----
    def send(self, message: str) -> None:
        assert self.peer is not None, "connect() first"
        self.agent.send_notif(self.peer.name, message.encode())

    def wait(self, *prefixes: str, timeout_s: float) -> str:
        """The first message starting with one of ``prefixes`` (removed from the inbox)."""

        def found() -> str | None:
            for notifs in self.agent.get_new_notifs().values():
                self._inbox += [n.decode(errors="replace") for n in notifs]
            for msg in self._inbox:
                if msg.startswith("abort:"):
                    raise PeerAborted(f"peer {self.peer.name if self.peer else '?'}: {msg[6:]}")
                if msg.startswith(prefixes):
                    self._inbox.remove(msg)
                    return msg
            return None

        # Each poll also progresses this agent's UCX worker: keep pauses short, since a peer's
        # transfer over an emulated transport (tcp) needs this side to progress.
        what = f"message {' or '.join(prefixes)} from the peer"
        return poll_until(found, timeout_s, what, max_pause_s=0.001)

    def release_handles(self) -> None:
        """Release every transfer and descriptor-list handle made so far (newest first)."""
        for handle in reversed(self._handles):
            try:
                handle.release()
            except Exception:  # best effort at teardown
                pass
        self._handles.clear()

    def close(self) -> None:
        self.release_handles()
        try:
            self.agent.deregister_memory(self._reg)
            if self.peer is not None:
                self.agent.remove_remote_agent(self.peer.name)
        except Exception:
            pass
        del self.agent
