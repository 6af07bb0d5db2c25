"""Serve mode with third-party clients: ``python -m pdbench serve``, then ``vllm bench serve
--backend openai-chat`` in every P/D flow (pull, recompute, decode_first), the OpenAI SDK
holding multi-turn conversations by ``X-Session-ID``, and pdbench's own client on the same
load; the router's per-request record attributes every request; Ctrl-C stops it all."""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import NO_PREFLIGHT, REPO, pdbench_command, run_pdbench, server_pids
from tests.e2e.serve_clients import OUTPUT, PROMPTS, get, post

pytestmark = pytest.mark.e2e

SERVING = re.compile(r"serving (http://\S+) model (\S+) flow (\S+):")


class Served:
    """``python -m pdbench serve`` in its own session, its output read by a thread."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(
            pdbench_command(["serve", *args]),
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            # as from a terminal: Ctrl-C heard even when pytest itself was started in the
            # background (a shell's `cmd &` hands SIGINT on ignored, and Python keeps it so)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: re.Pattern, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if match := pattern.search(line):
                return match
        pytest.fail("no serving line:\n" + "".join(self.seen[-60:]))

    def stop(self) -> int:
        """Ctrl-C, as a user at the terminal does (the whole foreground group)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=180)
        finally:
            while not self.lines.empty():
                self.seen.append(self.lines.get())


def median_ci(values: list[float], resamples: int = 4000) -> list[float]:
    """The median and its 95% percentile-bootstrap interval (seeded)."""
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [statistics.median(values), meds[int(0.025 * resamples)], meds[int(0.975 * resamples)]]


def sdk_conversations(url: str, model: str, tag: str) -> dict[tuple[int, int], str]:
    """Two three-turn conversations with the OpenAI SDK, each named by X-Session-ID (tag
    "": named by nothing, as GuideLLM's multi-turn mode sends them): the answers' text by
    (conversation, turn)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    answers = {}
    for c in range(2):
        messages = [{"role": "system", "content": "ba " * 40 + f"ke{c}"}]
        for turn in range(1, 4):
            messages.append({"role": "user", "content": f"mo na ti ru {turn} " * 6})
            stream = client.chat.completions.create(
                model=model,
                messages=messages,
                max_completion_tokens=12,
                temperature=0.0,
                stream=True,
                extra_body={"ignore_eos": True, "min_tokens": 12},
                extra_headers={"X-Session-ID": f"{tag}-{c}"} if tag else {},
            )
            text = "".join(
                chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices
            )
            answers[(c, turn)] = text
            messages.append({"role": "assistant", "content": text})
    return answers


def test_third_party_clients_run_against_the_served_deployment(tmp_path):
    run_dir = tmp_path / "run"
    # the preflight has tests of its own (test_preflight.py, the smoke run)
    served = Served(["+experiment=smoke", "flow=pull", NO_PREFLIGHT, f"dir={run_dir}"])
    try:
        url, model, flow = served.wait_for(SERVING, 900).groups()
        assert flow == "pull"
        models = get(f"{url}/v1/models")
        assert models["data"][0]["id"] == model
        status = run_pdbench(["status", f"dir={run_dir}"], 120)
        assert f"{url} model {model}" in status.stdout and "serving now, flow pull" in status.stdout

        flows = ("pull", "recompute", "decode_first")
        clients = subprocess.run(
            [sys.executable, "-m", "tests.e2e.serve_clients", url, model, str(tmp_path), *flows],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert clients.returncode == 0, clients.stdout[-3000:] + clients.stderr[-3000:]
        compared = {}
        for flow, got in json.loads((tmp_path / "clients.json").read_text()).items():
            assert got["switched"] == {"flow": flow}
            bench, ours, stats = got["bench"], got["own"], got["stats"]
            assert bench["completed"] == PROMPTS and bench["failed"] == 0, bench
            assert bench["total_output_tokens"] == PROMPTS * OUTPUT
            assert [r["status"] for r in ours] == ["ok"] * PROMPTS, [r["error"] for r in ours]
            assert all(r["output_tokens"] == OUTPUT for r in ours)
            # single turns: nothing D holds to pull, or to serve alone, in any flow
            assert stats["paths"] == {"recompute": 2 * PROMPTS} and stats["failed"] == 0
            compared[flow] = {
                "vllm_bench_ttft_ms": [t * 1e3 for t in bench["ttfts"]],
                "pdbench_ttft_ms": [r["ttft_ms"] for r in ours],
            }
        assert set(compared) == set(flows)
        # what a comparison of the two clients on this load looks like (no assertion on
        # time: the README's section on serve mode reads the numbers)
        for c in compared.values():
            c["median_ms_95ci"] = {k: median_ci(v) for k, v in c.items()}
        (tmp_path / "compared.json").write_text(json.dumps(compared, indent=1))
        print(json.dumps({f: c["median_ms_95ci"] for f, c in compared.items()}))

        # A real SDK holding conversations by X-Session-ID: pulled from turn 2 in pull, and
        # the same answers as agg gives the same conversations.
        post(f"{url}/pdbench/flow", {"flow": "pull", "tag": "sdk-pull"})
        pulled = sdk_conversations(url, model, "sdk")
        stats = get(f"{url}/pdbench/stats")
        assert stats["paths"].get("pull", 0) >= 1, stats
        post(f"{url}/pdbench/flow", {"flow": "agg", "tag": "sdk-agg"})
        assert sdk_conversations(url, model, "sdk-agg") == pulled
        # no header at all: the router finds each conversation by the tokens D holds
        post(f"{url}/pdbench/flow", {"flow": "pull", "tag": "sdk-anonymous"})
        assert sdk_conversations(url, model, "") == pulled
        assert get(f"{url}/pdbench/stats")["paths"].get("pull", 0) == 4, "turns 2, 3 of two"
        (record_path,) = (run_dir / "serve").glob("*.json")
        printed = json.loads(record_path.read_text())
        d_leases_only_for_turns_that_can_be_continued(url, model, printed["metrics"]["decode0"])
        clients = run_printed_clients(url, printed["clients"])
    finally:
        rc = served.stop()
    # Ctrl-C reached the driver alone (submitit's controller and the task ignore it); it
    # stopped the job with SIGTERM, waited for the servers' teardown, and exited 128 + 2
    assert rc == 128 + signal.SIGINT, "".join(served.seen[-40:])
    assert any("[pdbench] Ctrl-C: stopping the jobs this launch follows" in x for x in served.seen)
    assert server_pids(run_dir) == []
    (record,) = (run_dir / "serve").glob("*.json")
    record = json.loads(record.read_text())
    assert record["url"] == url and record["stopped_at"]
    # the router's own record of every request, to attribute an external client's run
    lines = [json.loads(x) for x in Path(record["request_log"]).read_text().splitlines()]
    chat = [x for x in lines if x["api"] == "chat" and x["status"] == 200]
    assert len([x for x in chat if x["flow"] != "agg"]) >= 6 * PROMPTS
    for x in chat:
        assert x["prompt_tokens"] > 0 and x["spans_ms"]["d"] > 0
        if x["path"] != "agg":
            assert x["p_cached_tokens"] >= 0 and x["spans_ms"]["p"] > 0
    pulls = [x for x in chat if x["path"] == "pull"]
    assert pulls and all(x["offered_tokens"] > 0 and x["session"] for x in pulls)
    # the answer's length, for a replay: D's count (the SDK asked no usage, and saw none)
    sdk = [x for x in chat if x["session"].startswith("sdk")]
    assert len(sdk) == 12 and all(x["output_tokens"] == 12 for x in sdk)
    assert {x["matched"] for x in sdk} == {"header"}
    # the header-free conversations: each turn after the first found by its prefix, pulled
    found = [x for x in chat if x["request_id"].startswith("pdb-sdk-anonymous-")]
    assert len(found) == 6 and all(x["session"].startswith("prefix-") for x in found)
    assert sorted((x["turn"], x["matched"], x["path"]) for x in found) == [
        (1, "", "recompute"),
        (1, "", "recompute"),
        (2, "prefix", "pull"),
        (2, "prefix", "pull"),
        (3, "prefix", "pull"),
        (3, "prefix", "pull"),
    ]
    assert len({x["session"] for x in found}) == 2
    third_party_multi_turn_turns_pulled(lines, clients)
    # the SDK's conversations as the router recorded them (the other clients' left out)
    sdk_log = tmp_path / "sdk_requests.jsonl"
    sdk_log.write_text(
        "".join(json.dumps(x) + "\n" for x in lines if x["request_id"].startswith("pdb-sdk"))
    )
    replay_recorded_session(tmp_path, sdk_log)


def d_kv_usage(metrics_url: str) -> float:
    """D's share of KV blocks in use (vLLM's metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(metrics_url, timeout=30) as resp:
        text = resp.read().decode()
    values = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return values["vllm:kv_cache_usage_perc"]


def d_leases_only_for_turns_that_can_be_continued(url: str, model: str, d_metrics: str) -> None:
    """Single-turn requests naming no conversation: in recompute nothing can pull them, so D
    frees their blocks at once (its KV usage does not rise); in pull a next turn could extend
    them (prefix matching), so D keeps them: the same requests raise it."""
    body = {"model": model, "max_tokens": 8, "temperature": 0.0}
    rises = {}
    for flow in ("recompute", "pull"):
        post(f"{url}/pdbench/flow", {"flow": flow, "tag": f"lease-{flow}"})
        before = d_kv_usage(d_metrics)
        for i in range(6):
            post(f"{url}/v1/completions", {**body, "prompt": [5 + i] * 40 + list(range(3, 40))})
        time.sleep(1.0)  # the last request's blocks freed, or kept
        after = d_kv_usage(d_metrics)
        rises[flow] = after - before
        if flow == "recompute":  # leases of the earlier loads may run out meanwhile
            assert after <= before, (before, after)
    assert rises["pull"] > 0, rises


def run_printed_clients(url: str, printed: dict[str, str]) -> dict[str, list[str]]:
    """The commands serve printed for AIPerf, GuideLLM and vllm bench serve, run as printed
    (AIPerf and GuideLLM from their own venv: scripts/clients-venv.sh), each under a flow tag
    of its own; the router's request ids of each client's requests start with its tag."""
    venv = subprocess.run(
        ["scripts/clients-venv.sh"], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    assert venv.returncode == 0, "make clients failed:\n" + venv.stderr[-3000:]
    # python: pdbench's own (vllm bench's module form); aiperf, guidellm: their venv's
    bins = f"{Path(sys.executable).parent}:{venv.stdout.strip()}/bin:{os.environ['PATH']}"
    tags = {}
    for client, command in printed.items():
        tag = re.sub(r"\W+", "-", client.lower())
        post(f"{url}/pdbench/flow", {"flow": "pull", "tag": tag})
        ran = subprocess.run(
            ["bash", "-c", command],
            cwd=REPO,
            env={**os.environ, "PATH": bins},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert ran.returncode == 0, f"{client}: {command}\n{ran.stdout[-3000:]}{ran.stderr[-3000:]}"
        tags[client] = [f"pdb-{tag}-"]
    return tags


def third_party_multi_turn_turns_pulled(lines: list[dict], clients: dict[str, list[str]]) -> None:
    """AIPerf's conversations named by its X-Correlation-ID, GuideLLM's by nothing: every
    turn after the first whose history is the ids D generated is pulled in pull, matched by
    that header or by its prefix; vllm bench serve's single turns answered."""

    def of(client: str) -> list[dict]:
        (tag,) = clients[client]
        return [x for x in lines if x["request_id"].startswith(tag)]

    whole_histories_pulled(of("AIPerf"), "header")
    whole_histories_pulled(of("GuideLLM"), "prefix")
    bench = of("vllm bench serve")
    assert len(bench) == 16 and {x["status"] for x in bench} == {200}


def whole_histories_pulled(turns: list[dict], how: str) -> None:
    """One client's requests: each whose history is whole (the first turn's prompt plus, per
    turn before, an answer and a prompt) found by ``how`` and pulled; each other one shorter
    than a whole history by at most the answers' tokens, and never pulled onto other tokens.

    The clients resend the answers as text. The random model now and then emits a special
    token, which the text drops: that history no longer begins with the ids D holds (how
    often depends on the greedy tokens: 0-1 of a client's 16 later turns in three runs, 5 of
    GuideLLM's in each of two on 2026-12-02). Named by AIPerf's header, such a turn is
    recomputed (recompute_diverged), parting from D's tokens inside the resent answer; found
    by nothing (GuideLLM), it extends no conversation and is a first turn. A later turn may
    still be pulled onto the history D computed for such a turn: a pull, not whole."""
    from jobs.serving.client_commands import CONVERSATIONS, OUTPUT_TOKENS, PROMPT_TOKENS, TURNS

    assert len(turns) == CONVERSATIONS * TURNS and {x["status"] for x in turns} == {200}
    opening = min(x["prompt_tokens"] for x in turns)
    whole = {opening + k * (PROMPT_TOKENS + OUTPUT_TOKENS): k for k in range(1, TURNS)}
    first = {(x["session"], x["turn"]): x for x in turns}
    for x in turns:
        n = x["prompt_tokens"]
        if n in whole:
            assert x["matched"] == how and x["path"] == "pull" and x["offered_tokens"] > 0, x
        elif x["path"] == "pull":
            assert x["matched"] == how and x["offered_tokens"] > 0, x
        elif n != opening:  # the text dropped tokens of an answer before it
            assert any(w - k * OUTPUT_TOKENS <= n < w for w, k in whole.items()), x
            if how == "header":  # still its conversation: recomputed where it parts from D's
                assert x["path"] == "recompute_diverged", x
                earlier = first[(x["session"], x["turn"] - 1)]
                assert earlier["prompt_tokens"] <= x["diverged_at"] < n, x
            else:
                assert x["matched"] == "" and x["path"] == "recompute", x
    if how == "header":
        assert sorted(x["turn"] for x in turns) == sorted(list(range(1, TURNS + 1)) * CONVERSATIONS)
    assert sum(x["prompt_tokens"] == opening for x in turns) == CONVERSATIONS, turns
    assert any(x["prompt_tokens"] in whole for x in turns), sorted(
        x["prompt_tokens"] for x in turns
    )


def replay_recorded_session(tmp_path: Path, log: Path) -> None:
    """The SDK's six conversations as the router recorded them, replayed under recompute
    and pull: the same conversations, turn order, gaps and prompt lengths; pulled from
    turn 2 in pull; the same tokens in both flows."""
    from pdbench.config.schema import TraceConfig
    from pdbench.traffic.replay import plan_replay
    from pdbench.traffic.trace import prompt_lengths
    from tests.e2e.conftest import all_points, request_records

    run_dir = tmp_path / "replay"
    args = [
        "+experiment=flows",
        "workload=trace",
        f"workload.trace.path={log}",
        "workload.trace.min_turns=2",  # the SDK's conversations, not the single requests
        "flow.flows=[recompute,pull]",
        "workload.repetitions=2",
        "launch.check_premises=false",
        NO_PREFLIGHT,
        f"dir={run_dir}",
    ]
    proc = run_pdbench(args, 1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    recorded = plan_replay(TraceConfig(path=str(log), min_turns=2), 16).replayed
    assert len(recorded.conversations) == 6  # the SDK's, named or found by their prefix
    planned = {
        (c, t): (turn.at_s, n)
        for c, conv in enumerate(recorded.conversations)
        for t, (turn, n) in enumerate(zip(conv.turns, prompt_lengths(conv), strict=True), 1)
    }
    points = all_points(run_dir)
    assert len(points) == 4 and all(p["status"] == "ok" for p in points)
    for rep in (0, 1):
        got = {}
        for p in points:
            if p["workload"]["repetition"] == rep:
                recs = request_records(run_dir, p)
                got[p["flow"]] = {(r["conversation"], r["turn"]): r for r in recs}
        for flow, recs in got.items():
            assert set(recs) == set(planned), flow
            for key, r in recs.items():
                at_s, prompt = planned[key]
                assert r["prompt_tokens"] == prompt and r["status"] == "ok"
                assert abs(r["offered_s"] - at_s) < 1e-6  # the recorded gaps, as recorded
        assert {k: r["output_token_ids"] for k, r in got["pull"].items()} == {
            k: r["output_token_ids"] for k, r in got["recompute"].items()
        }
        assert all(r["path"] == "pull" for k, r in got["pull"].items() if k[1] >= 2)
