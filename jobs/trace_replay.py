"""A trace's conversations as the load generator sends them: token ids for every turn.

Mooncake: each hash id is a block of seeded token ids (seeded by the workload's seed and the
id: equal ids are equal tokens in every flow and conversation, so blocks a trace shares,
such as a system prompt, are shared here too); a turn's new message is the tokens of the
blocks it adds, cut or padded to its length. OpenAI: the messages' text through the model's
tokenizer, cut to the scaled length. A recorded session: seeded tokens of its lengths. A
turn the recording marks as diverged (the client had edited its history) is replayed with
an edit of the history before it (``strip_reply``), so the router sees it diverge too.
"""

from __future__ import annotations

import random
from pathlib import Path

from jobs.workload import FIRST_ID, ConversationSpec
from pdbench.config.schema import HistoryEdit, TraceTiming, WorkloadConfig
from pdbench.traffic.replay import Replay, plan_replay, token_counter
from pdbench.traffic.trace import TraceConversation, TraceFormat


class Encoder:
    """Text to token ids with the served model's tokenizer (None where it has none here)."""

    def __init__(self, model_path: str):
        self._tokenizer = None
        file = Path(model_path) / "tokenizer.json"
        if file.is_file():
            from tokenizers import Tokenizer  # lazy: only for openai traces

            self._tokenizer = Tokenizer.from_file(str(file))

    def __call__(self, text: str) -> list[int] | None:
        if self._tokenizer is None:
            return None
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


def seeded_tokens(key: str, n: int, vocab_size: int) -> list[int]:
    """``n`` token ids drawn from ``key`` alone (a string seed: the same in every process)."""
    rng = random.Random(key)
    top = max(FIRST_ID + 1, vocab_size - 1)
    return [rng.randint(FIRST_ID, top) for _ in range(n)]


def fitted(ids: list[int], n: int, pad_key: str, vocab_size: int) -> list[int]:
    """``ids`` cut to ``n``, or padded to it with seeded tokens."""
    if len(ids) >= n:
        return ids[:n]
    return ids + seeded_tokens(pad_key, n - len(ids), vocab_size)


def replay_for(workload: WorkloadConfig, model_path: str, generated: bool) -> Replay:
    """The Point's replay, read on this node: the file the launch validated, or an error
    naming both digests (it changed since, or this node sees another file)."""
    count, counted_by = token_counter(model_path, generated)
    replay = plan_replay(workload.trace, workload.output_tokens, count, counted_by)
    launched = workload.trace.sha256
    if launched and replay.digest != launched:
        raise RuntimeError(
            f"{workload.trace.path} has sha256 {replay.digest[:12]} here, {launched[:12]} at "
            "launch: the trace changed since (launch again to replay the new one)"
        )
    return replay


def trace_conversations(
    workload: WorkloadConfig, replay: Replay, vocab_size: int, model_path: str
) -> list[ConversationSpec]:
    """Every conversation of ``replay`` with the token ids of the Point's repetition (its
    workload seed), offered at the trace's times when the replay follows them."""
    seed, trace = workload.seed, replay.replayed
    encode = Encoder(model_path) if trace.format is TraceFormat.openai else None
    timed = replay.timing is TraceTiming.recorded
    specs = []
    for c, conv in enumerate(trace.conversations):
        spec = _spec(c, conv, seed, trace.block_tokens, vocab_size, encode)
        if timed:
            spec.offered_s = [t.at_s or 0.0 for t in conv.turns]
        specs.append(spec)
    return specs


def _spec(
    c: int,
    conv: TraceConversation,
    seed: int,
    block_tokens: int,
    vocab_size: int,
    encode: Encoder | None,
) -> ConversationSpec:
    def block(hash_id: int) -> list[int]:
        return seeded_tokens(f"{seed}:block:{hash_id}", block_tokens, vocab_size)

    def text_ids(text: str | None, n: int, key: str) -> list[int]:
        ids = (encode(text) if encode is not None and text is not None else None) or []
        return fitted(ids, n, key, vocab_size)

    prefix = text_ids(conv.system_text, conv.system_tokens, f"{seed}:system:{c}")
    user_turns = []
    for t, turn in enumerate(conv.turns, start=1):
        pad = f"{seed}:user:{c}:{t}"
        if turn.blocks:
            ids = [i for b in turn.blocks for i in block(b)]
            user_turns.append(fitted(ids, turn.user_tokens, pad, vocab_size))
        else:
            user_turns.append(text_ids(turn.user_text, turn.user_tokens, pad))
    edits = {
        t: HistoryEdit.strip_reply.value
        for t, turn in enumerate(conv.turns, start=1)
        if turn.diverged and t > 1
    }
    return ConversationSpec(
        conversation=c,
        prefix=prefix,
        user_turns=user_turns,
        output_lens=[t.output_tokens for t in conv.turns],
        edits=edits,
        seed=seed,
    )
