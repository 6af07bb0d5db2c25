"""P dies while D holds a conversation's blocks for it: D frees them within the TTL and keeps
serving; the Point's record says how long they were held.

With ``bidirectional_kv_xfer`` D keeps each finished turn's KV for P to pull next turn
(the review of the vLLM change: "holding blocks on D complicates workflow for when P dies").
Here P is SIGKILLed while D decodes turn 1, so nobody ever pulls what D keeps: vLLM's
lease (``decoder_kv_blocks_ttl``) must release it. The bound checked is functional (the
TTL plus a generous margin for sampling and a loaded 2-core host), not a performance timing.

At concurrency 2 the conversations' first turns overlap: one can be decoding on D while
the other is still queued or prefilling on P, or D is still pulling its KV from P. P is
killed only once every turn 1 is past P (``wait_until_turn_1_left_p``), so that every
turn 1 must succeed and every turn 2 (it starts on P) must fail.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from jobs.measure import metrics
from tests.e2e.conftest import NO_PREFLIGHT, load_points, server_pids, wait_for_line
from tests.e2e.test_faults import server_on_port, start_pdbench

pytestmark = pytest.mark.e2e

TTL_S = 20
MARGIN_S = 10.0
# Ports of its own (test_faults.py's are others): the test talks to P and D by port, on
# whichever xdist worker runs it (conftest.worker_ports).
P_PORT, D_PORT = 8880, 8881
CONVERSATIONS = 2
ARGS = [
    "+experiment=decode_cost",
    "flow.flows=[pull]",
    f"flow.decoder_kv_blocks_ttl_s={TTL_S}",
    f"workload.conversations={CONVERSATIONS}",
    "workload.turns=2",
    "workload.output_tokens=48",
    "workload.concurrency=2",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    NO_PREFLIGHT,
    f"server.base_port={P_PORT}",
    "server.side_channel_base_port=6180",
    "server.router_port=8690",
    "server.vllm_base_port=19680",
]


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return metrics.parse_prometheus(resp.read().decode())


def wait_until_turn_1_left_p(conversations: int, timeout_s: float = 120) -> dict[str, float]:
    """Every conversation's turn 1 is on D past its pull from P, and D still decodes one.

    D runs a request only once its KV is in: vLLM keeps one that waits for P's KV among
    its waiting requests. So turn 1 has left P for all when D's running requests plus
    those it finished since the Point began make ``conversations``; none of turn 2 (it
    starts on P) can have begun while D has not finished them all. Returns D's metrics then.
    """
    before = scrape(D_PORT).get("vllm:request_success_total", 0.0)
    deadline = time.monotonic() + timeout_s
    now: dict[str, float] = {}
    while time.monotonic() < deadline:
        now = scrape(D_PORT)
        running = int(now.get("vllm:num_requests_running", 0))
        finished = int(now.get("vllm:request_success_total", 0.0) - before)
        if finished >= conversations:
            pytest.fail(
                f"D finished all {conversations} turn-1 requests before the test saw them all "
                f"on D together with one still decoding (polling too slow?): {now}"
            )
        if running + finished >= conversations:
            return now
        time.sleep(0.05)
    pytest.fail(
        f"turn 1 of all {conversations} conversations never reached D within {timeout_s} s: "
        f"D's last metrics {now}"
    )


def d_answers_alone() -> list[int]:
    """A plain completion on D (no KV params): D keeps serving with P gone."""
    with urllib.request.urlopen(f"http://127.0.0.1:{D_PORT}/v1/models", timeout=10) as resp:
        model = json.loads(resp.read())["data"][0]["id"]  # the preset's model
    body = {"model": model, "prompt": [1, 2, 3, 4, 5], "max_tokens": 4, "temperature": 0}
    req = urllib.request.Request(
        f"http://127.0.0.1:{D_PORT}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        return json.loads(resp.read())["usage"]["completion_tokens"]


def test_p_killed_while_d_holds_blocks_d_frees_them_within_the_ttl(tmp_path: Path):
    run_dir = tmp_path / "run"
    proc = start_pdbench([*ARGS, f"dir={run_dir}"])
    try:
        wait_for_line(proc, "point [1/1]", 900)
        prefill = server_on_port(run_dir, P_PORT)  # found first: the kill follows the wait
        at_kill = wait_until_turn_1_left_p(CONVERSATIONS)
        os.killpg(os.getpgid(prefill.pid), signal.SIGKILL)
        held = scrape(D_PORT)["vllm:kv_cache_usage_perc"]
        assert d_answers_alone() == 4
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert held > 0, "D held nothing for P after turn 1"
    (point,) = load_points(run_dir).values()
    assert point["status"] == "failed" and "prefill0" in point["error"], point["error"][:500]
    reqs = [json.loads(x) for x in (run_dir / point["requests_file"]).read_text().splitlines()]
    failed_1 = [r["error"] for r in reqs if r["turn"] == 1 and r["status"] != "ok"]
    assert not failed_1, f"turn 1 failed after it left P: {failed_1}; D when P died: {at_kill}"
    assert len([r for r in reqs if r["turn"] == 1]) == CONVERSATIONS
    assert {r["status"] for r in reqs if r["turn"] == 2} == {"failed"}  # P gone: router 502
    bill = point["decode_bill"]
    # what D kept of turn 1 was never pulled; its lease released it, within the TTL + margin
    assert bill["expired_leases"] >= 2, bill
    assert 0 < bill["release_s"] <= TTL_S + MARGIN_S, bill
    samples = point["kv_timeline"]["decode0"]
    assert max(s[1] for s in samples) > 0 and samples[-1][1] == 0.0
    assert server_pids(run_dir) == []
