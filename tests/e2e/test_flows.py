"""The four flows on one deployment, with clients that edit their histories: decode_first
takes both of its paths and, like every flow, gives agg's greedy tokens; an edited history
is never pulled."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import (
    NO_PREFLIGHT,
    outputs_by_turn,
    request_records,
    run_pdbench,
    server_pids,
)

pytestmark = pytest.mark.e2e

FLOWS = ("agg", "recompute", "pull", "decode_first")


def test_edited_histories_are_never_pulled_and_every_flow_matches_agg_in_chat_too(tmp_path):
    """Clients that strip part of a reply or edit an earlier message send a prompt that no
    longer begins with the tokens D holds: P must recompute it (vLLM answers wrong tokens
    when P pulls D's KV under other tokens). With such edits on half the turns, by token ids
    and by chat messages, every flow still gives agg's greedy tokens; edited turns are never
    pulled nor served by D alone, the others still are (decode_first both serves turns on D
    alone and falls back on pulls), and the router counts them. The sweep's two jobs (one
    per API) share one start of the servers."""
    run_dir = tmp_path / "run"
    args = [
        "-m",
        "+experiment=flows",
        f"dir={run_dir}",
        "workload.api=completions,chat",
        "workload.history_edit=mixed",
        "workload.conversations=4",
        "workload.turns=4",
        "workload.concurrency=4",
        "workload.repetitions=1",  # a pipeline test (the preset runs 3): premises off
        "launch.check_premises=false",
        NO_PREFLIGHT,
    ]
    proc = run_pdbench(args, 2400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    # The two compositions of the sweep differ in their workload only: the servers started
    # once and measured the Points of both (pdbench/plan/sweep.py).
    assert (
        "[pdbench] sweep: launch 1 measures 2 composition(s) on one start of its servers: "
        "workload.api=completions; workload.api=chat"
    ) in proc.stdout
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert len(manifest["jobs"]) == 1, manifest["jobs"]
    assert [launch["config"]["workload"]["api"] for launch in manifest["launches"]] == [
        "completions",
        "chat",
    ]
    points = [json.loads(p.read_text()) for p in (run_dir / "points").glob("*.json")]
    assert {(p["workload"]["api"], p["flow"]) for p in points} == {
        (api, flow) for api in ("completions", "chat") for flow in FLOWS
    }
    for api in ("completions", "chat"):
        mine = {p["flow"]: p for p in points if p["workload"]["api"] == api}
        assert all(p["status"] == "ok" for p in mine.values()), api
        agg = outputs_by_turn(run_dir, mine["agg"])
        for flow in ("recompute", "pull", "decode_first"):
            assert outputs_by_turn(run_dir, mine[flow]) == agg, (api, flow)
        for flow in ("pull", "decode_first"):
            records = request_records(run_dir, mine[flow])
            edited = [r for r in records if r["history_edit"]]
            assert {r["history_edit"] for r in edited} == {"strip_reply", "change_message"}
            assert {r["path"] for r in edited} == {"recompute_diverged"}, (api, flow)
            kept = {r["path"] for r in records if r["turn"] > 1 and not r["history_edit"]}
            assert kept & {"pull", "decode_first"}, (api, flow, kept)  # the rest still pull
            if flow == "decode_first":  # D served turns alone and fell back on pulls
                assert {"decode_first", "pull"} <= kept, (api, kept)
                assert {row["turn"]: row["paths"] for row in mine[flow]["by_turn"]}[1] == {
                    "recompute": len({r["conversation"] for r in records})
                }, api  # turn 1: nothing on D yet
            router = mine[flow]["router"]
            assert router["diverged"] == router["paths"]["recompute_diverged"] >= len(edited)
    # the router's own record of every request: the route and where the prompt diverged
    lines = [
        json.loads(line)
        for log in run_dir.glob("logs/*/router_requests.jsonl")
        for line in log.read_text().splitlines()
    ]
    assert {x["api"] for x in lines} == {"completions", "chat"}
    diverged = [x for x in lines if x["path"] == "recompute_diverged"]
    assert diverged and all(0 <= x["diverged_at"] < x["prompt_tokens"] for x in diverged)
    assert all(x["offered_tokens"] == 0 and x["p_cached_tokens"] >= 0 for x in diverged)
    assert server_pids(run_dir) == []
