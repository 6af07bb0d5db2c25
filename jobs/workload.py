"""Multi-turn load generator: N conversations x T turns, driven in turn waves.

Prompts are token ids, so lengths are exact and turn k's prompt is turn k-1's prompt plus
its output plus the new user message: the KV a server kept from the last turn is a true
prefix of the next. Turns advance in waves (every conversation's turn t, then t+1), so the
server counters scraped between waves attribute prompt tokens to a turn exactly.
Within a wave, ``concurrency`` bounds requests in flight and ``request_rate`` (if > 0)
spaces their starts (Poisson arrivals).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from jobs.request_stream import RequestOptions, stream_one
from pdbench.config.schema import WorkloadConfig, WorkloadKind
from pdbench.plan.lengths import draw_length
from pdbench.results.store import RequestRecord

T = TypeVar("T")

FIRST_ID = 3  # ids below are special tokens of the tiny tokenizer (unk, bos, eos)


@dataclass
class ConversationSpec:
    conversation: int
    prefix: list[int]  # shared history before turn 1 (``history_tokens`` long)
    user_turns: list[list[int]]  # one user message per turn
    output_lens: list[int] | None = None  # tokens to generate per turn; None: the options'


def build_conversations(
    workload: WorkloadConfig, history_tokens: int, vocab_size: int
) -> list[ConversationSpec]:
    """Deterministic token-id conversations of ``workload`` with ``history_tokens`` of prefix.

    ``multi_turn`` and ``agentic``: each conversation has its own prefix of
    ``history_tokens``; ``long_doc``: all share one prefix (the document), so their first
    turns differ only after it. User message and output lengths are drawn around
    ``user_tokens`` and ``output_tokens`` (``draw_length``; jitter 0: fixed), from ``seed``;
    ``output_tokens`` 0 leaves the length to the request options.
    """
    wl = workload
    seed, distribution = wl.seed, wl.length_distribution
    rng = random.Random(seed)
    lengths = random.Random(seed + 1)  # lengths apart: changing them keeps the token ids
    top = max(FIRST_ID + 1, vocab_size - 1)

    def tokens(n: int) -> list[int]:
        return [rng.randint(FIRST_ID, top) for _ in range(n)]

    document = tokens(history_tokens) if wl.kind is WorkloadKind.long_doc else None
    specs = []
    for c in range(wl.conversations):
        prefix = list(document) if document is not None else tokens(history_tokens)
        user = [
            tokens(draw_length(lengths, wl.user_tokens, wl.user_tokens_jitter, distribution))
            for _ in range(wl.turns)
        ]
        outputs = None
        if wl.output_tokens > 0:
            outputs = [
                draw_length(lengths, wl.output_tokens, wl.output_tokens_jitter, distribution)
                for _ in range(wl.turns)
            ]
        specs.append(
            ConversationSpec(conversation=c, prefix=prefix, user_turns=user, output_lens=outputs)
        )
    return specs


def run_client(coro: Awaitable[T]) -> T:
    """Run the load generator's coroutine to completion on uvloop when installed (a vLLM
    dependency): each token's wake-up costs about half of asyncio's loop there, and at 256
    streams whose tokens arrive together, that cost is what delays the last stream's stamp."""
    try:
        import uvloop  # lazy: optional: a faster loop when installed
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


class LoadGenerator:
    """Runs conversations in turn waves against one URL and returns every request record."""

    def __init__(self, opts: RequestOptions, concurrency: int, request_rate: float, seed: int):
        self.opts = opts
        self.concurrency = max(1, concurrency)
        self.request_rate = request_rate
        self.rng = random.Random(seed)

    async def run(
        self,
        specs: list[ConversationSpec],
        on_wave_done: Callable[[int, list[RequestRecord]], Awaitable[None]] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[RequestRecord]:
        import aiohttp  # lazy: ~0.4 s, only when requests are sent (the driver imports jobs/)

        timeout = aiohttp.ClientTimeout(total=self.opts.timeout_s)
        connector = aiohttp.TCPConnector(limit=0)
        records: list[RequestRecord] = []
        histories = {s.conversation: list(s.prefix) for s in specs}
        alive = {s.conversation for s in specs}
        t0 = time.perf_counter()
        turns = max(len(s.user_turns) for s in specs)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            for turn in range(1, turns + 1):
                gate = asyncio.Semaphore(self.concurrency)
                wave: list[RequestRecord] = []

                async def one(
                    spec: ConversationSpec, delay: float, turn=turn, gate=gate, wave=wave
                ):
                    await asyncio.sleep(delay)
                    async with gate:
                        history = histories[spec.conversation]
                        prompt = history + spec.user_turns[turn - 1]
                        n_out = spec.output_lens[turn - 1] if spec.output_lens else None
                        rec = await stream_one(
                            session,
                            self.opts,
                            spec.conversation,
                            turn,
                            prompt,
                            len(history),
                            t0,
                            n_out,
                        )
                    wave.append(rec)
                    if rec.status == "ok":
                        histories[spec.conversation] = prompt + rec.output_token_ids
                    else:
                        alive.discard(spec.conversation)  # its history is unknown from here
                    if progress:
                        progress(1)

                delays = self._arrival_delays(len(specs))
                await asyncio.gather(
                    *(
                        one(s, d)
                        for s, d in zip(specs, delays, strict=True)
                        if s.conversation in alive
                    )
                )
                wave.sort(key=lambda r: r.conversation)
                records.extend(wave)
                if on_wave_done:
                    await on_wave_done(turn, wave)
        return records

    def _arrival_delays(self, n: int) -> list[float]:
        if self.request_rate <= 0:
            return [0.0] * n
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += self.rng.expovariate(self.request_rate)
        return out
