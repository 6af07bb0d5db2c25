"""A stand-in for ``nixl_agent`` whose transfers finish after a set number of state polls.

Only for driving the transfer tracer through states a real agent cannot be steered into on
demand (still in progress, failed); the bench and the e2e tier use real NIXL agents.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeTelemetry:
    totalBytes: int  # NIXL's field names
    descCount: int
    xferDuration: int = 1500  # microseconds
    postDuration: int = 20
    startTime: int = 0


class FakeHandle:
    def __init__(self, op: str, descriptors: int, notif: bytes):
        self.op, self.descriptors, self.notif = op, descriptors, notif
        self.polls_left = 0
        self.posted = False
        self.released = False


@dataclass
class FakeNixlAgent:
    """Polls until DONE = ``cycles_before_done``; ``fail_next`` makes the next transfer ERR."""

    bytes_per_desc: int = 4096
    cycles_before_done: int = 2
    fail_next: bool = False
    calls: list[str] = field(default_factory=list)

    def make_prepped_xfer(
        self, operation, local_side, local_indices, remote_side, remote_indices, notif_msg=b""
    ):
        self.calls.append("make_prepped_xfer")
        return FakeHandle(operation, len(local_indices), notif_msg)

    def transfer(self, handle, notif_msg=b""):
        self.calls.append("transfer")
        handle.posted = True
        handle.polls_left = self.cycles_before_done
        handle.failed, self.fail_next = self.fail_next, False
        return "PROC"

    def check_xfer_state(self, handle):
        self.calls.append("check_xfer_state")
        if getattr(handle, "failed", False):
            return "ERR"
        if handle.polls_left > 1:
            handle.polls_left -= 1
            return "PROC"
        return "DONE"

    def get_xfer_telemetry(self, handle):
        return FakeTelemetry(handle.descriptors * self.bytes_per_desc, handle.descriptors)

    def query_xfer_backend(self, handle):
        return "UCX"

    def release_xfer_handle(self, handle):
        self.calls.append("release_xfer_handle")
        handle.released = True

    def get_agent_metadata(self):
        return b"fake-metadata"
