"""Per-transfer traces from two real vLLM-CPU servers (P and D) moving KV with NIXL.

Reads the smoke run (`make demo`, which traces: conftest's ``smoke_dry_and_real``, shared
with test_smoke.py and test_launch_spec.py): pdbench's vLLM plugin
(``connector.plugin.vllm_plugin``, built on ``connector.plugin.tracing``) writes one JSON line per
completed NIXL transfer under ``<run>/traces/<deployment>/``.
"""

from __future__ import annotations

import json
import re

import pytest

from connector.layout import KVShape, dtype_nbytes

pytestmark = pytest.mark.e2e

# conf/model/tiny_llama.yaml: 2 layers, 2 KV heads, head_dim 128 / 4 = 32, float32.
TINY = KVShape(2, 2, 32, dtype_nbytes("float32"), block_size=32)


def test_every_transfer_of_a_pd_run_is_traced(smoke_run):
    run_dir, _ = smoke_run

    files = sorted((run_dir / "traces").glob("*/*.jsonl"))
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    assert rows, f"no trace lines in {run_dir / 'traces'}"
    engines = {r["engine_id"] for r in rows}
    assert len(engines) == 2, "pull flow: D pulls from P, then P pulls history back from D"
    for r in rows:
        assert r["status"] in ("ok", "failed")
        assert r["op"] == "READ" and r["backend"] == "UCX"
        assert r["request_id"] and r["remote_request_id"]
        assert r["blocks"] >= 1 and r["tokens"] == r["blocks"] * TINY.block_size
        assert r["post_time"] > 0
        if r["role"] in ("prefill", "decode"):
            assert r["direction"] == {"prefill": "P<-D", "decode": "D<-P"}[r["role"]]
        if r["status"] == "ok":
            # What NIXL says it moved is what the layout says a block of this model weighs.
            assert r["bytes"] == r["blocks"] * TINY.bytes_per_block
            assert r["transfer_s"] > 0

    # Per Point, the traces add up to the NIXL bytes the servers' own counters report, a
    # failed trace line is a transfer vLLM counted failed (vLLM-CPU sometimes stalls long
    # enough for a lease to run out; the Point records it), and the router's request ids
    # (which name the Point and turn) tie each transfer to a turn.
    points = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    assert {p["flow"] for p in points} == {"agg", "recompute", "pull"}
    for point in points:
        mine = [r for r in rows if point["point_id"] in r["request_id"]]
        if point["flow"] == "agg":  # one server: nothing to move
            assert not mine and point["transfer"]["bytes"] == 0, point["point_id"]
            continue
        ok = [r for r in mine if r["status"] == "ok"]
        assert point["trace_files"], point["point_id"]
        assert sum(r["bytes"] for r in ok) == point["transfer"]["bytes"] > 0, point["flow"]
        # Every failed trace line is a failure vLLM counted (vLLM also counts failures that
        # never reach a transfer state, e.g. a post that raised: hence <=, not ==).
        assert len(mine) - len(ok) <= point["transfer"]["failed"], point["flags"]
        pulls_back = [r for r in mine if r["direction"] == "P<-D"]
        turns = [int(re.search(r"-t(\d+)-", r["request_id"]).group(1)) for r in pulls_back]
        assert all(t >= 2 for t in turns), turns
        if point["flow"] == "pull":
            assert pulls_back, "P pulled no history from D in the pull flow"
        else:
            assert not pulls_back, "recompute must not pull history"
