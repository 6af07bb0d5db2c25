"""Small traces in every format pdbench reads, generated (no downloads): for tests, for the
the docs' examples (docs/traffic.md) and for trying a replay before bringing one's own traffic.

    python -m pdbench.traffic.examples mooncake /tmp/chat.jsonl --conversations 60

Mooncake-style: conversations whose prompts share a system prompt's blocks, grow turn by
turn (each prompt the last one, its reply and a new message: the last, partial block's id
changes as it fills, as in Mooncake's release), some branching off an earlier turn, turns
paused as people pause (lognormal, median ``pause_s``), lengths up to tens of thousands of
tokens. OpenAI: conversation files of made-up words. pdbench: a router's request log.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from pdbench.traffic.trace import TraceFormat
from pdbench.traffic.words import made_up_words

RECORDED_EPOCH_S = 1_800_000_000.0  # unix time of an example log's first request


@dataclass(frozen=True)
class ExampleShape:
    conversations: int = 60
    turns_max: int = 8
    block_tokens: int = 512
    system_blocks: int = 2  # every conversation begins with these blocks (a system prompt)
    first_tokens: int = 4000  # median of a first prompt's own tokens (lognormal)
    user_tokens: int = 400  # median of a later turn's new message
    output_tokens: int = 250  # median reply
    pause_s: float = 60.0  # median pause between a conversation's turns
    span_s: float = 600.0  # conversations start over this long
    branch_share: float = 0.1  # share of conversations that fork an earlier turn


def _lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return int(min(high, max(low, round(median * math.exp(rng.gauss(0.0, sigma))))))


@dataclass
class _Prompt:
    tokens: int
    ids: list[int]


def mooncake_lines(shape: ExampleShape, seed: int) -> list[dict]:
    """The requests of a Mooncake-style trace, in timestamp order."""
    rng = random.Random(seed)
    bt = shape.block_tokens
    next_id = shape.system_blocks
    system = list(range(shape.system_blocks))

    def grown(prompt: _Prompt, add: int) -> _Prompt:
        nonlocal next_id
        tokens = prompt.tokens + add
        keep = prompt.ids[: prompt.tokens // bt]  # full blocks keep their ids
        fresh = math.ceil(tokens / bt) - len(keep)
        ids = keep + list(range(next_id, next_id + fresh))
        next_id += fresh
        return _Prompt(tokens, ids)

    rows: list[dict] = []
    histories: list[list[tuple[float, _Prompt, int]]] = []
    for _ in range(shape.conversations):
        at = rng.uniform(0, shape.span_s)
        first = _lognormal(rng, shape.first_tokens, 1.0, bt + 1, 24 * bt)
        prompt = grown(_Prompt(shape.system_blocks * bt, list(system)), first)
        turns: list[tuple[float, _Prompt, int]] = []
        for t in range(rng.randint(1, shape.turns_max)):
            if t:
                last_at, last, last_out = turns[-1]
                at = last_at + _lognormal(rng, shape.pause_s, 0.8, 2, 3600)
                prompt = grown(last, last_out + _lognormal(rng, shape.user_tokens, 0.8, 1, 4 * bt))
            out = _lognormal(rng, shape.output_tokens, 0.6, 1, 2 * bt)
            turns.append((at, prompt, out))
        histories.append(turns)
    branches = round(shape.branch_share * shape.conversations)
    for _ in range(branches):
        turns = rng.choice([h for h in histories if len(h) > 1] or histories)
        at, prompt, out = turns[rng.randrange(len(turns))]
        fork = grown(prompt, out + _lognormal(rng, shape.user_tokens, 0.8, 1, 4 * bt))
        histories.append([(at + rng.uniform(1, shape.pause_s), fork, out)])
    for turns in histories:
        for at, prompt, out in turns:
            rows.append(
                {
                    "timestamp": round(at * 1000),
                    "input_length": prompt.tokens,
                    "output_length": out,
                    "hash_ids": prompt.ids,
                }
            )
    rows.sort(key=lambda r: r["timestamp"])
    return rows


def openai_conversations(shape: ExampleShape, seed: int) -> list[dict]:
    """Conversations of made-up words (in the generated tiny models' vocabulary), as
    vLLM's ``benchmarks/multi_turn`` reads them; half start with a system message."""
    rng = random.Random(seed)
    words = made_up_words(500, 0)

    def text(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    out = []
    for c in range(shape.conversations):
        messages = []
        if c % 2 == 0:
            messages.append({"role": "system", "content": text(rng.randint(8, 40))})
        for _ in range(rng.randint(1, shape.turns_max)):
            user = _lognormal(rng, shape.user_tokens / 8, 0.6, 1, shape.block_tokens)
            reply = _lognormal(rng, shape.output_tokens / 16, 0.6, 1, shape.block_tokens)
            messages.append({"role": "user", "content": text(user)})
            messages.append({"role": "assistant", "content": text(reply)})
        out.append({"id": f"conversation-{c}", "messages": messages})
    return out


def recorded_lines(shape: ExampleShape, seed: int) -> list[dict]:
    """A router's request log of several conversations (one turn with an edited history,
    one request that named no conversation, one that failed)."""
    rng = random.Random(seed)
    rows = []
    for c in range(shape.conversations):
        at = RECORDED_EPOCH_S + rng.uniform(0, shape.span_s / 10)
        held = 0
        for t in range(1, rng.randint(2, max(2, shape.turns_max)) + 1):
            if t > 1:
                at += _lognormal(rng, shape.pause_s / 10, 0.8, 1, 600)
            prompt = held + _lognormal(rng, shape.user_tokens / 4, 0.6, 1, 1024)
            out = _lognormal(rng, shape.output_tokens / 16, 0.6, 1, 256)
            diverged = held // 2 if (c, t) == (0, 2) else -1
            rows.append(_log_line(f"session-{c}", t, at, prompt, out, diverged, 200))
            held = prompt + out
    first = RECORDED_EPOCH_S + 0.5
    rows.append(_log_line("", 0, first, 40, 8, -1, 200))
    rows.append(_log_line("session-0", 0, first + 1, 30, 0, -1, 400))
    rows.sort(key=lambda r: r["at"])
    return rows


def _log_line(
    session: str, turn: int, at: float, prompt: int, out: int, diverged: int, status: int
) -> dict:
    return {
        "request_id": f"example-{session or 'alone'}-{turn}-{status}",
        "session": session,
        "api": "completions",
        "flow": "recompute",
        "path": "recompute",
        "turn": turn,
        "prompt_tokens": prompt,
        "output_tokens": out,
        "diverged_at": diverged,
        "status": status,
        "at": round(at, 3),
    }


def write_example(fmt: TraceFormat, path: str | Path, shape: ExampleShape, seed: int) -> Path:
    """Write an example trace of ``fmt`` to ``path``; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt is TraceFormat.openai:
        out.write_text(json.dumps(openai_conversations(shape, seed), indent=1) + "\n")
    else:
        rows = (
            mooncake_lines(shape, seed)
            if fmt is TraceFormat.mooncake
            else recorded_lines(shape, seed)
        )
        out.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pdbench.traffic.examples", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("format", choices=[f.value for f in TraceFormat if f.value != "auto"])
    parser.add_argument("out", help="the file to write")
    parser.add_argument("--conversations", type=int, default=ExampleShape.conversations)
    parser.add_argument("--turns-max", type=int, default=ExampleShape.turns_max)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 1 <= args.conversations <= 100_000 or not 1 <= args.turns_max <= 1000:
        parser.error("--conversations 1 to 100,000 and --turns-max 1 to 1,000")
    shape = ExampleShape(conversations=args.conversations, turns_max=args.turns_max)
    path = write_example(TraceFormat(args.format), args.out, shape, args.seed)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
