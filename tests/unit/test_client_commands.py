"""The client commands serve prints: each names the served deployment, its tokenizer and
where its results go; the key only as its variable; GuideLLM reads conversations of the
tokenizer's own words when its English prompts would all be unknown to it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from jobs.serving import client_commands as cc
from pdbench.config.schema import ModelConfig
from pdbench.driver.tiny_model import build_tokenizer

pytestmark = pytest.mark.unit

SERVED = cc.Served(
    url="http://10.0.0.5:8000",
    model="tiny_llama",
    tokenizer="/models/tiny dir",
    results_dir="/runs/r/clients",
)


def test_every_client_reaches_the_router_with_the_models_tokenizer():
    commands = cc.commands(SERVED)
    assert set(commands) == {"vllm bench serve", "AIPerf", "GuideLLM"}
    for client, line in commands.items():
        words = shlex.split(line)  # each pastes into a shell as one command
        assert any(SERVED.url in w for w in words), client
        assert any(w.endswith("/models/tiny dir") for w in words), client
        assert any(w.startswith("/runs/r/clients/") or "/runs/r/clients/" in w for w in words)
    assert commands["vllm bench serve"].startswith("python -m benchmarks.vllm_bench_serve")
    gpu = cc.commands(cc.Served(**{**SERVED.__dict__, "on_cpu": False}))
    assert gpu["vllm bench serve"].startswith("vllm bench serve ")
    # AIPerf names its conversations by its own header; GuideLLM by nothing: no option here
    assert "--session-header" not in commands["AIPerf"]
    assert "synthetic_text" in commands["GuideLLM"] and f"turns={cc.TURNS}" in commands["GuideLLM"]


def test_a_key_is_passed_as_its_variable_never_written_out():
    commands = cc.commands(cc.Served(**{**SERVED.__dict__, "api_key": True}))
    assert '--api-key "$PDBENCH_API_KEY"' in commands["AIPerf"]
    assert ',api_key=$PDBENCH_API_KEY"' in commands["GuideLLM"]
    assert commands["vllm bench serve"].startswith("OPENAI_API_KEY=$PDBENCH_API_KEY ")
    # as a shell expands them: the key's value, nowhere in the printed line
    env = {"PDBENCH_API_KEY": "s3cret", "PATH": os.environ["PATH"]}
    for line in commands.values():
        assert "s3cret" not in line
        echoed = subprocess.run(
            ["bash", "-c", f"printf '%s\\n' {line.split(' ', 1)[1]}"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "s3cret" in echoed or line.startswith("OPENAI_API_KEY")


def test_guidellm_gets_conversations_in_the_word_level_tokenizers_words(tmp_path):
    model = ModelConfig(vocab_size=64)
    build_tokenizer(model, tmp_path)
    words = cc.tokenizer_words(str(tmp_path))
    assert len(words) == 64 - 3 and "<unk>" not in words
    path = cc.write_conversations(words, tmp_path / "clients" / "conversations.jsonl")
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(rows) == cc.CONVERSATIONS
    for row in rows:
        assert sorted(row) == sorted(
            [f"prompt_{t}" for t in range(cc.TURNS)]
            + [f"output_tokens_count_{t}" for t in range(cc.TURNS)]
        )
        assert all(len(row[f"prompt_{t}"].split()) == cc.PROMPT_TOKENS for t in range(cc.TURNS))
        assert set(row["prompt_0"].split()) <= set(words)
    line = cc.guidellm(cc.Served(**{**SERVED.__dict__, "conversations_file": str(path)}))
    assert f"kind=json_file,path={path}" in line
    assert cc.tokenizer_words(str(tmp_path / "none")) == []  # no tokenizer: synthetic text
