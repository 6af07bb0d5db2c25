"""workload=trace on a real deployment: a generated Mooncake-style trace (shared system
prompt, multi-turn conversations, branches, lengths up to tens of thousands of tokens) scaled
to the machine and replayed at its own (sped-up) times, and an OpenAI conversation file
replayed as chat in a closed loop. The conversations are reconstructed (later turns pulled in
pull), every flow gives agg's greedy tokens, the prompts are as long as the replay planned,
the manifest keeps the trace's digest and shape, and the analysis answers which flow."""

from __future__ import annotations

import hashlib
import json

import pytest

from pdbench.config.schema import TraceConfig
from pdbench.traffic import examples
from pdbench.traffic.replay import plan_replay
from pdbench.traffic.trace import TraceFormat, prompt_lengths
from tests.e2e.conftest import (
    NO_PREFLIGHT,
    all_points,
    request_records,
    run_analysis,
    run_pdbench,
)

pytestmark = pytest.mark.e2e

SCALE = 1 / 64  # a ~20,000-token conversation becomes ~300 tokens: tiny_llama's 2,048 fit
SPEEDUP = 60  # pauses of ~1 min become ~1 s: inside the pull window of the 15 s lease


def replay_args(run_dir, path, *more: str) -> list[str]:
    return [
        "+experiment=flows",
        "workload=trace",
        f"workload.trace.path={path}",
        f"dir={run_dir}",
        "workload.repetitions=2",
        "launch.check_premises=false",
        NO_PREFLIGHT,
        *more,
    ]


def by_flow(run_dir) -> dict[tuple[str, int], dict]:
    points = all_points(run_dir)
    assert all(p["status"] == "ok" for p in points), [p["error"][:300] for p in points]
    return {(p["flow"], p["workload"].get("repetition", p.get("repetition", 0))): p for p in points}


def replayed(tmp_path, fmt: TraceFormat, name: str, shape, seed: int, *more: str):
    """An example trace of ``fmt`` written and replayed: its path, the run dir, the run."""
    path = examples.write_example(fmt, tmp_path / name, shape, seed)
    run_dir = tmp_path / "run"
    proc = run_pdbench(replay_args(run_dir, path, *more), 1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return path, run_dir, proc


def test_a_mooncake_trace_replays_its_conversations_in_every_flow(tmp_path):
    path, run_dir, proc = replayed(
        tmp_path,
        TraceFormat.mooncake,
        "chat.jsonl",
        examples.ExampleShape(conversations=10, turns_max=4, span_s=60.0),
        1,
        "flow.flows=[agg,recompute,pull]",
        f"workload.trace.length_scale={SCALE}",
        f"workload.trace.speedup={SPEEDUP}",
    )
    assert "[pdbench] trace " in proc.stdout and "replayed" in proc.stdout  # its shape

    plan = plan_replay(
        TraceConfig(path=str(path), length_scale=SCALE, speedup=SPEEDUP), 16
    ).replayed
    planned = {
        (c, t): n
        for c, conv in enumerate(plan.conversations)
        for t, n in enumerate(prompt_lengths(conv), start=1)
    }
    assert max(t for _, t in planned) > 1  # conversations were found
    points = by_flow(run_dir)
    for rep in (0, 1):
        recs = {f: request_records(run_dir, points[(f, rep)]) for f in ("agg", "recompute", "pull")}
        key = {f: {(r["conversation"], r["turn"]): r for r in rs} for f, rs in recs.items()}
        assert set(key["agg"]) == set(planned)  # every turn of the replay, once
        for flow, rs in key.items():
            assert all(r["status"] == "ok" for r in rs.values())
            # prompts as the replay planned: the trace's lengths, scaled
            assert {k: r["prompt_tokens"] for k, r in rs.items()} == planned, flow
            # the trace's times, sped up, offered alike in every flow
            assert {k: r["offered_s"] for k, r in rs.items()} == {
                k: r["offered_s"] for k, r in key["agg"].items()
            }
            # token-exact against agg, turn by turn
            assert {k: r["output_token_ids"] for k, r in rs.items()} == {
                k: r["output_token_ids"] for k, r in key["agg"].items()
            }, flow
        later = [r for k, r in key["pull"].items() if k[1] >= 2]
        pulled = [r for r in later if r["path"] == "pull"]
        assert len(pulled) >= len(later) // 2, [r["path"] for r in later]
        load = points[("pull", rep)]["offered_load"]
        assert load["offered_rate"] > 0 and load["achieved_rate"] > 0

    manifest = json.loads((run_dir / "manifest.json").read_text())
    traffic = manifest["traffic"]
    assert traffic["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert traffic["format"] == "mooncake" and traffic["timing"] == "recorded"
    assert traffic["replayed"]["requests"] == len(planned)
    assert traffic["recorded"]["prompt_max"] > 64 * traffic["replayed"]["prompt_max"] // 2

    analysis = run_analysis(run_dir)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    # the replay's answer card first (after the line saying what was measured)
    cards = [x for x in analysis.stdout.splitlines() if " → " in x]
    assert "trace chat.jsonl (mooncake): fastest flow for this traffic:" in cards[0], cards
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    (answer,) = summary["questions"]["replay"]
    assert set(answer["flows"]) == {"agg", "recompute", "pull"}
    assert answer["flows"]["pull"]["pulled"]["value"] > 0


def test_an_openai_conversation_file_replays_as_chat_in_a_closed_loop(tmp_path):
    path, run_dir, _ = replayed(
        tmp_path,
        TraceFormat.openai,
        "conv.json",
        examples.ExampleShape(conversations=6, turns_max=3),
        2,
        "flow.flows=[agg,recompute,pull]",
        "workload.api=chat",
        "workload.concurrency=3",
    )
    conversations = json.loads(path.read_text())
    turns = {
        (c, t)
        for c, conv in enumerate(conversations)
        for t in range(1, 1 + sum(m["role"] == "user" for m in conv["messages"]))
    }
    points = by_flow(run_dir)
    for rep in (0, 1):
        got = {
            f: {
                (r["conversation"], r["turn"]): r
                for r in request_records(run_dir, points[(f, rep)])
            }
            for f in ("agg", "recompute", "pull")
        }
        tokens = {f: {k: r["output_token_ids"] for k, r in rs.items()} for f, rs in got.items()}
        assert set(tokens["agg"]) == turns
        assert tokens["pull"] == tokens["recompute"] == tokens["agg"]  # token-exact
        # each reply as long as the file's assistant message (words: the tiny tokenizer's)
        for (c, t), r in got["pull"].items():
            replies = [m for m in conversations[c]["messages"] if m["role"] == "assistant"]
            assert len(r["output_token_ids"]) == len(replies[t - 1]["content"].split())
        later = [r for k, r in got["pull"].items() if k[1] >= 2]
        assert later and all(r["path"] == "pull" for r in later), [r["path"] for r in later]
        assert all(r["offered_s"] < 0 for r in got["pull"].values())  # a closed loop
