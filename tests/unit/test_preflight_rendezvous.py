"""The preflight's cross-node protocol with real files and sockets: two ranks as threads."""

from __future__ import annotations

import json
import threading

import pytest

from jobs.preflight import rendezvous
from jobs.preflight.probes import inspect_model
from jobs.preflight.runner import cross_node_checks
from jobs.preflight.spec import NodeExpectation, PreflightSpec

pytestmark = pytest.mark.unit

TWO_NODES = PreflightSpec(
    nodes=(NodeExpectation(0, ()), NodeExpectation(1, ())), run_dir="/r", model_path="/m"
)


def run_ranks(rdvs, addresses=("127.0.0.1", "127.0.0.1"), timeout_s=5.0, vllms=("0.32.0",) * 2):
    results = {}

    def one(rank):
        results[rank] = cross_node_checks(
            TWO_NODES, rank, rdvs[rank], addresses[rank], timeout_s, vllms[rank]
        )

    threads = [threading.Thread(target=one, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return {rank: {r.check: r for r in res} for rank, res in results.items()}


def test_shared_dir_and_reachable_addresses_pass(tmp_path):
    rdv = tmp_path / "rdv"
    results = run_ranks([rdv, rdv])
    for rank in (0, 1):
        assert results[rank]["run_dir"].ok and results[rank]["reach"].ok, results[rank]
        assert "1 other node(s) answer" in results[rank]["reach"].found
    assert json.loads((rdv / "node-1.json").read_text())["port"] > 0
    assert (rdv / "done-0").exists() and (rdv / "done-1").exists()
    assert results[0]["vllm_version"].ok and results[1]["vllm_version"].ok


@pytest.mark.parametrize("addresses", [("127.0.0.1", "127.0.0.1"), ("", "")])
def test_nodes_of_two_vllm_releases_fail_before_any_server_starts(tmp_path, addresses):
    """NIXL's handshake differs between vLLM 0.32 and 0.33: a mixed deployment would fail
    every pull, so the preflight refuses it, on each node, naming the other's release."""
    results = run_ranks([tmp_path / "rdv"] * 2, addresses, vllms=("0.32.0", "0.33.0"))
    for rank, other in ((0, "0.33.0"), (1, "0.32.0")):
        check = results[rank]["vllm_version"]
        assert not check.ok and f"runs vllm {other}" in check.found, check
        assert "one vLLM on every node" in check.line("node")


def test_a_run_dir_each_node_sees_alone_fails_the_run_dir_check(tmp_path):
    results = run_ranks([tmp_path / "a", tmp_path / "b"], timeout_s=0.5)
    line = results[0]["run_dir"].line("node0 (n1)")
    assert not results[0]["run_dir"].ok
    assert "no file from node1" in line and "not one directory shared by every node" in line
    assert "Fix: dir=<a path on a filesystem every node mounts" in line
    assert results[1]["reach"].skipped


def test_an_address_that_leads_elsewhere_fails_the_reach_check(tmp_path):
    rdv = tmp_path / "rdv"
    # Rank 1 "published" an address whose port another process answers (a loopback alias).
    with rendezvous.TokenServer("127.0.0.1", "someone-else") as impostor:
        rendezvous.publish(
            rdv,
            1,
            {
                "rank": 1,
                "hostname": "n2",
                "address": "127.0.0.1",
                "port": impostor.port,
                "token": "t1",
            },
        )
        rendezvous.mark_done(rdv, 1)
        results = cross_node_checks(TWO_NODES, 0, rdv, "127.0.0.1", 2.0)
    reach = {r.check: r for r in results}["reach"]
    assert not reach.ok
    assert "cannot reach node1 (n2) at 127.0.0.1:" in reach.found
    assert "answered as another process" in reach.found


def test_probe_of_a_closed_port_says_so():
    with rendezvous.TokenServer("127.0.0.1", "x") as server:
        port = server.port
    assert "refused" in rendezvous.probe_peer("127.0.0.1", port, "x", timeout_s=1).lower()


def test_inspect_model_directory_and_hub_cache(tmp_path):
    model = tmp_path / "model"
    assert inspect_model(str(model), {}).problem == "no such directory on this node"
    model.mkdir()
    assert "config.json not readable" in inspect_model(str(model), {}).problem
    (model / "config.json").write_text("{}")
    assert inspect_model(str(model), {}).problem == "no *.safetensors or *.bin weights"
    (model / "model.safetensors").write_bytes(b"\0" * 16)
    facts = inspect_model(str(model), {})
    assert facts.problem == "" and "1 weight file(s)" in facts.detail
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    hub = inspect_model("org/tiny", env)
    assert hub.kind == "hub" and hub.offline and "HF_HUB_OFFLINE=1 forbids" in hub.problem
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / "rev1"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"\0")
    assert inspect_model("org/tiny", env).problem == ""
