"""The one file rendezvous (connector.shared_files.Rendezvous) and the deployment job's use of
it: every wait ends, with what was found or a clear failure, never hangs."""

from __future__ import annotations

import threading
import time

import pytest

from connector.shared_files import PeerFailed, Rendezvous
from jobs.run.rendezvous import (
    RENDEZVOUS_TIMEOUT_S,
    START_SKEW_S,
    NodeFailed,
    NodeRendezvous,
    gather_timeout_s,
)

pytestmark = pytest.mark.unit


def test_a_wait_returns_every_file_or_names_the_missing_ones(tmp_path):
    meeting = Rendezvous(tmp_path / "rdv")
    meeting.publish_json("a.json", {"x": 1})
    assert meeting.wait(["a.json"], 1.0, "a") == {"a.json": {"x": 1}}
    found, missing = meeting.gather(["a.json", "b.json"], 0.1)
    assert found == {"a.json": {"x": 1}} and missing == ["b.json"]
    with pytest.raises(TimeoutError, match="waiting for peer b: no b.json in .*rdv"):
        meeting.wait(["a.json", "b.json"], 0.1, "peer b")


def test_a_peer_that_cannot_come_ends_the_wait_at_once_with_its_error(tmp_path):
    meeting = Rendezvous(tmp_path)
    meeting.publish_failure("b", "ServerStartError: b exited with code 2")
    start = time.monotonic()
    with pytest.raises(PeerFailed, match="b: ServerStartError: b exited with code 2"):
        meeting.wait(["b.json"], 60.0, "peer b", failures=["b"])
    assert time.monotonic() - start < 30  # not the deadline


def test_a_file_published_later_is_found(tmp_path):
    meeting = Rendezvous(tmp_path)
    later = threading.Timer(0.2, meeting.publish, ("late", b"here"))
    later.start()
    assert meeting.wait(["late"], 10.0, "late", parse=meeting.read) == {"late": b"here"}


def two_nodes(tmp_path) -> tuple[NodeRendezvous, NodeRendezvous]:
    return (
        NodeRendezvous.of_attempt(str(tmp_path), "42", 1, nodes=2, rank=0),
        NodeRendezvous.of_attempt(str(tmp_path), "42", 1, nodes=2, rank=1),
    )


def test_task_0_learns_every_nodes_servers(tmp_path):
    zero, one = two_nodes(tmp_path)
    assert zero.directory == tmp_path / "42.1"
    zero.publish_node("10.0.0.1", {"prefill0": "http://10.0.0.1:8100"}, "0")
    one.publish_node("10.0.0.2", {"decode0": "http://10.0.0.2:8101"}, None)
    nodes = zero.gather_nodes(timeout_s=5)
    assert nodes.addresses == {0: "10.0.0.1", 1: "10.0.0.2"}
    assert nodes.devices == {0: "0", 1: None}
    assert nodes.hosts["decode0"].endswith("(10.0.0.2)")


def test_task_0_stops_waiting_when_a_node_failed(tmp_path):
    zero, one = two_nodes(tmp_path)
    zero.publish_node("a", {}, None)
    one.publish_failure("decode0 not healthy after 600 s")
    with pytest.raises(NodeFailed, match="node1: decode0 not healthy"):
        zero.gather_nodes(timeout_s=60)


def test_the_other_tasks_wait_for_task_0_to_be_done_or_failed(tmp_path):
    zero, one = two_nodes(tmp_path)
    zero.start_heartbeat(every_s=0.05)
    threading.Timer(0.3, zero.done).start()
    one.wait_for_rank0(silent_s=5.0, poll_s=0.05)  # returns: task 0 is done
    zero, one = two_nodes(tmp_path / "failed")
    zero.publish_failure("preflight node0 gpus: found 0 GPUs")
    with pytest.raises(NodeFailed, match="node0 failed: preflight node0 gpus"):
        one.wait_for_rank0(silent_s=5.0, poll_s=0.05)


def test_a_silent_task_0_fails_the_others_after_the_deadline(tmp_path):
    zero, one = two_nodes(tmp_path)
    zero.start_heartbeat(every_s=0.05)
    time.sleep(0.2)
    zero._beating.set()  # task 0 dies without a word: its heartbeat stops, no done.json
    with pytest.raises(NodeFailed, match="node0 gave no sign of life for 0 s"):
        one.wait_for_rank0(silent_s=0.4, poll_s=0.05)


def test_task_0_waits_for_the_others_as_long_as_their_servers_may_take_to_start():
    """A 70B model may load for up to server.startup_timeout_s (1,800 s on GPU clusters):
    task 0 must not give up on a node whose servers are still starting."""
    assert gather_timeout_s(1800) == 1800 + START_SKEW_S
    assert gather_timeout_s(60) == RENDEZVOUS_TIMEOUT_S  # never below the old floor
