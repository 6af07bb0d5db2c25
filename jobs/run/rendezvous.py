"""How the tasks of one deployment job meet, through ``<rendezvous_dir>/<job id>.<restart>/``
(``connector.shared_files.Rendezvous``; a requeued job keeps its id, the restart count keeps
its attempts apart).

Every task publishes ``node<rank>.json`` once its servers are healthy (its address, host
name, server URLs, devices), or ``node<rank>.failed`` when they cannot start. Task 0 waits
for every node's file (``RENDEZVOUS_TIMEOUT_S``), measures, then publishes ``done.json``; the
other tasks wait for that, stopping at once when task 0 failed and, when task 0 gives no
sign of life for ``RANK0_SILENT_S`` (its task died without a word), with a clear failure.
Task 0 gives that sign by rewriting ``alive.json`` every ``HEARTBEAT_S`` from the start.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from connector.shared_files import PeerFailed, Rendezvous

RENDEZVOUS_TIMEOUT_S = 600.0  # how long task 0 waits for every node's servers, at least
START_SKEW_S = 120.0  # the other nodes may start their servers this much later than task 0
HEARTBEAT_S = 10.0  # how often task 0 says it is alive
# Silence after which the other tasks give up on task 0: well above the heartbeat, since a
# shared filesystem may show a rewritten file a minute late (NFS attribute caching).
RANK0_SILENT_S = 300.0


def gather_timeout_s(startup_timeout_s: float) -> float:
    """How long task 0 waits for the other nodes' servers once its own are up: as long as
    any node's may take to start (``server.startup_timeout_s``, 1,800 s on GPU clusters:
    a 600 s wait gave up on a 70B model still loading), plus the skew between the tasks'
    starts; never below ``RENDEZVOUS_TIMEOUT_S``. A node whose servers fail says so at once
    (its failure file), so the wait is long only for a node still starting."""
    return max(RENDEZVOUS_TIMEOUT_S, startup_timeout_s + START_SKEW_S)


class NodeFailed(RuntimeError):
    """Another task of the job could not start its servers, or stopped answering."""


@dataclass(frozen=True)
class Nodes:
    """What task 0 learns from every node's file."""

    hosts: dict[str, str]  # instance name -> "hostname (address)"
    addresses: dict[int, str]  # node -> the address its servers bind
    devices: dict[int, str | None]  # node -> its CUDA_VISIBLE_DEVICES


@dataclass
class NodeRendezvous:
    """One task's side of the job's rendezvous."""

    directory: Path
    nodes: int
    rank: int
    _beating: threading.Event = field(default_factory=threading.Event, repr=False)

    @classmethod
    def of_attempt(cls, rendezvous_dir: str, job_id: str, attempt: int, nodes: int, rank: int):
        directory = Path(rendezvous_dir) / f"{job_id}.{attempt}"
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory, nodes, rank)

    @property
    def files(self) -> Rendezvous:
        return Rendezvous(self.directory)

    def publish_node(self, host: str, urls: dict[str, str], devices: str | None) -> None:
        """This task's servers are up: where they are."""
        record = {
            "host": host,
            "hostname": socket.gethostname(),
            "urls": urls,
            "cuda_visible_devices": devices,
        }
        self.files.publish_json(f"node{self.rank}.json", record)

    def publish_failure(self, error: str) -> None:
        self.files.publish_failure(f"node{self.rank}", error)

    def gather_nodes(self, timeout_s: float = RENDEZVOUS_TIMEOUT_S) -> Nodes:
        """Task 0: every node's file; ``NodeFailed`` as soon as one says it failed."""
        names = [f"node{n}" for n in range(self.nodes)]
        try:
            found = self.files.wait(
                [f"{n}.json" for n in names],
                timeout_s,
                "every node's servers",
                failures=names,
                max_pause_s=0.5,
            )
        except PeerFailed as exc:
            raise NodeFailed(str(exc)) from None
        hosts: dict[str, str] = {}
        addresses: dict[int, str] = {}
        devices: dict[int, str | None] = {}
        for node, name in enumerate(names):
            data = found[f"{name}.json"]
            addresses[node] = data["host"]
            devices[node] = data.get("cuda_visible_devices")
            for instance in data["urls"]:
                hosts[instance] = f"{data['hostname']} ({data['host']})"
        return Nodes(hosts, addresses, devices)

    def wait_for_rank0(self, silent_s: float = RANK0_SILENT_S, poll_s: float = 1.0) -> None:
        """The other tasks: until task 0 is done. ``NodeFailed`` when it failed, or when its
        heartbeat did not change for ``silent_s`` (by this task's clock: no clock skew)."""
        files = self.files
        last_beat, last_change = None, time.monotonic()
        while files.read("done.json") is None:
            error = files.failure("node0")
            if error is not None:
                raise NodeFailed(f"node0 failed: {error}")
            beat = files.read("alive.json")
            if beat != last_beat:
                last_beat, last_change = beat, time.monotonic()
            elif time.monotonic() - last_change > silent_s:
                raise NodeFailed(
                    f"node0 gave no sign of life for {silent_s:.0f} s (no change to "
                    f"{files.path('alive.json')}): its task died without a word. Fix: read "
                    "node0's task log (the submitit folder of the run dir)"
                )
            time.sleep(poll_s)

    def start_heartbeat(self, every_s: float = HEARTBEAT_S) -> None:
        """Task 0: rewrite ``alive.json`` every ``every_s`` until ``done``."""

        def beat() -> None:
            count = 0
            while not self._beating.is_set():
                count += 1
                try:
                    self.files.publish_json("alive.json", {"beat": count, "at": time.time()})
                except OSError:
                    pass  # a filesystem hiccup: the next beat tries again
                self._beating.wait(every_s)

        threading.Thread(target=beat, name="pdbench-heartbeat", daemon=True).start()

    def done(self) -> None:
        """Task 0: the run is over (measured, failed or interrupted): the others tear down."""
        self._beating.set()
        self.files.publish_json("done.json", {"at": time.time()})
