"""The transfer tracer against a fake NIXL agent and a stand-in vLLM worker."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest

from connector.plugin.transfer_trace import (
    TracingNixlWrapper,
    direction,
    install_tracer,
    trace_settings,
)
from tests.fakes.fake_nixl import FakeNixlAgent

pytestmark = pytest.mark.unit


class StandInWorker:
    """The attributes of a vLLM NIXL worker the tracer reads: 4 layers, 32-token blocks."""

    def __init__(self, agent):
        self.nixl_wrapper = agent
        self.tp_rank = 1
        self.block_size = 32
        self.num_regions = 4
        self._transfer_layer_region_indices = ()
        self._recving_transfers = defaultdict(list)

    def read(self, req_id: str, blocks: int, remote_req: str):
        """What ``pull_worker._read_blocks`` does: make, post, remember the handle."""
        ids = list(range(blocks * self.num_regions))
        handle = self.nixl_wrapper.make_prepped_xfer(
            "READ", "local", ids, "remote", ids, notif_msg=f"{remote_req}:1".encode()
        )
        self.nixl_wrapper.transfer(handle)
        self._recving_transfers[req_id].append(handle)
        return handle

    def pop_done(self):
        """What ``base_worker._pop_done_transfers`` does."""
        done = set()
        for req_id, handles in list(self._recving_transfers.items()):
            left = []
            for h in handles:
                state = self.nixl_wrapper.check_xfer_state(h)
                if state == "DONE":
                    self.nixl_wrapper.get_xfer_telemetry(h)
                    self.nixl_wrapper.release_xfer_handle(h)
                elif state == "PROC":
                    left.append(h)
                else:
                    self.nixl_wrapper.release_xfer_handle(h)
            if left:
                self._recving_transfers[req_id] = left
            else:
                done.add(req_id)
                del self._recving_transfers[req_id]
        return done


def lines(tmp_path):
    files = list(tmp_path.glob("*.jsonl"))
    assert len(files) <= 1
    if not files:
        return []
    return [json.loads(x) for x in files[0].read_text().splitlines()]


def test_one_line_per_completed_transfer(tmp_path):
    agent = FakeNixlAgent(bytes_per_desc=8192, cycles_before_done=3)
    worker = StandInWorker(agent)
    install_tracer(worker, str(tmp_path), "decode", "engine-d")
    assert isinstance(worker.nixl_wrapper, TracingNixlWrapper)
    assert worker.nixl_wrapper.get_agent_metadata() == b"fake-metadata"  # forwarded

    worker.read("req-1", blocks=5, remote_req="p-req-1")
    worker.read("req-2", blocks=2, remote_req="p-req-2")
    assert worker.pop_done() == set()
    assert worker.pop_done() == set()
    assert lines(tmp_path) == []  # nothing completed yet
    assert worker.pop_done() == {"req-1", "req-2"}

    rows = lines(tmp_path)
    assert [r["request_id"] for r in rows] == ["req-1", "req-2"]
    first = rows[0]
    assert first["remote_request_id"] == "p-req-1"
    assert first["op"] == "READ" and first["direction"] == "D<-P" and first["role"] == "decode"
    assert first["engine_id"] == "engine-d" and first["tp_rank"] == 1
    assert first["blocks"] == 5 and first["tokens"] == 5 * 32
    assert first["descriptors"] == 20 and first["nixl_desc_count"] == 20
    assert first["bytes"] == 20 * 8192
    assert first["nixl_xfer_s"] == pytest.approx(0.0015)
    assert first["transfer_s"] >= 0 and first["post_time"] > 0
    assert first["backend"] == "UCX" and first["status"] == "ok"
    assert list(tmp_path.glob("decode-engine-d-tp1-*.jsonl"))


def test_failed_and_never_completed_transfers(tmp_path):
    agent = FakeNixlAgent(cycles_before_done=1)
    worker = StandInWorker(agent)
    install_tracer(worker, str(tmp_path), "prefill", "engine-p")
    agent.fail_next = True
    worker.read("req-bad", blocks=1, remote_req="x")
    worker.pop_done()
    # made but never posted, then released: no line
    handle = worker.nixl_wrapper.make_prepped_xfer("READ", "l", [0], "r", [0])
    worker.nixl_wrapper.release_xfer_handle(handle)
    rows = lines(tmp_path)
    assert len(rows) == 1
    assert rows[0]["status"] == "failed" and rows[0]["direction"] == "P<-D"


def test_tracing_never_breaks_the_transfer(tmp_path):
    agent = FakeNixlAgent(cycles_before_done=1)
    worker = StandInWorker(agent)
    install_tracer(worker, str(tmp_path / "file-in-the-way" / "x"), "decode", "e")
    (tmp_path / "file-in-the-way").write_text("not a directory")
    worker.read("req", blocks=1, remote_req="r")
    assert worker.pop_done() == {"req"}  # the write failed, the transfer did not


@pytest.mark.parametrize(
    ("role", "op", "want"),
    [("decode", "READ", "D<-P"), ("prefill", "READ", "P<-D"), ("prefill", "WRITE", "P->D"),
     ("mixed", "READ", "?<-?")],
)  # fmt: skip
def test_direction(role, op, want):
    assert direction(role, op) == want


def vllm_config(extra=None, kv_role="kv_both"):
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_role=kv_role, kv_connector_extra_config=extra)
    )


def test_trace_settings_sources():
    env = {"PDBENCH_TRACE_DIR": "/env/dir", "PDBENCH_ROLE": "decode"}
    assert trace_settings(vllm_config(), env) == ("/env/dir", "decode")
    extra = {"pdbench_trace_dir": "/cfg/dir", "pdbench_role": "prefill"}
    assert trace_settings(vllm_config(extra), {}) == ("/cfg/dir", "prefill")
    assert trace_settings(vllm_config(None, "kv_consumer"), {}) == ("", "decode")
    assert trace_settings(vllm_config(None), {}) == ("", "unknown")
