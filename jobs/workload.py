"""Multi-turn load generator: N conversations x T turns, driven in turn waves.

Prompts are token ids, so lengths are exact and turn k's prompt is turn k-1's prompt plus
its output plus the new user message: the KV a server kept from the last turn is a true
prefix of the next, unless the workload edits the history first as chat clients do
(``jobs.history``). With ``workload.api=chat`` the same conversations go as chat messages
(their text from the server's ``/detokenize``; each reply as the server streamed it), and
the router tokenizes them. Turns advance in waves (every conversation's turn t, then t+1),
so the server counters scraped between waves attribute prompt tokens to a turn exactly.
Within a wave, ``concurrency`` bounds requests in flight and ``request_rate`` (if > 0)
spaces their starts (Poisson arrivals). With open-loop arrivals (``workload.arrival``
poisson or gamma, ``pdbench.plan.arrivals``) each turn goes out at its offered time, or when
its conversation's previous turn is answered if that is later; the counters are then read
once, over the whole Point (its ``by_turn`` row 0).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from connector.process_env import bearer
from jobs.history import ASSISTANT, SYSTEM, USER, Message, apply_edit, edit_for, prompt_ids
from jobs.request_stream import RequestOptions, stream_one
from pdbench.config.schema import WorkloadConfig, WorkloadKind
from pdbench.plan.arrivals import OPEN, Slot, schedule
from pdbench.plan.lengths import draw_history, draw_length
from pdbench.plan.points import only
from records.point import RequestRecord

T = TypeVar("T")

FIRST_ID = 3  # ids below are special tokens of the tiny tokenizer (unk, bos, eos)


@dataclass
class ConversationSpec:
    conversation: int
    prefix: list[int]  # history before turn 1 (the common prefix, then its own)
    user_turns: list[list[int]]  # one user message per turn
    output_lens: list[int] | None = None  # tokens to generate per turn; None: the options'
    edits: dict[int, str] = field(default_factory=dict)  # turn -> history edit before it
    seed: int = 0  # the workload's: where an edit falls (``jobs.history.apply_edit``)
    # chat: the text of the prefix and of each user message (``LoadGenerator.prepare``)
    prefix_text: str | None = None
    user_texts: list[str] | None = None
    # a replayed trace's times: when each turn is offered (s from the Point's start; None:
    # the workload's arrivals decide)
    offered_s: list[float] | None = None


def build_conversations(
    workload: WorkloadConfig, history_tokens: int, vocab_size: int
) -> list[ConversationSpec]:
    """Deterministic token-id conversations of ``workload`` with ``history_tokens`` of prefix.

    ``multi_turn`` and ``agentic``: each conversation has its own prefix of
    ``history_tokens`` (or a lognormal length of that mean: ``history_median_ratio``);
    ``long_doc``: all share one prefix (the document), so their first turns differ only
    after it. Every prefix starts with the same ``common_prefix_tokens``. User message and
    output lengths are drawn around ``user_tokens`` and ``output_tokens`` (``draw_length``;
    jitter 0: fixed), turn counts in [``turns``, ``turns_max``], all from ``seed``;
    ``output_tokens`` 0 leaves the length to the request options. Which turns' histories
    are edited first is drawn here too (``jobs.history.edit_for``).
    """
    wl = workload
    seed, distribution = wl.seed, wl.length_distribution
    rng = random.Random(seed)
    lengths = random.Random(seed + 1)  # lengths apart: changing them keeps the token ids
    top = max(FIRST_ID + 1, vocab_size - 1)

    def tokens(n: int) -> list[int]:
        return [rng.randint(FIRST_ID, top) for _ in range(n)]

    document = tokens(history_tokens) if wl.kind is WorkloadKind.long_doc else None
    common = tokens(wl.common_prefix_tokens)
    specs = []
    for c in range(only(wl.conversations, "workload.conversations")):
        turns = lengths.randint(wl.turns, wl.turns_max) if wl.turns_max > wl.turns else wl.turns
        if document is not None:
            own = list(document)
        else:
            own = tokens(
                draw_history(
                    lengths, history_tokens, wl.history_median_ratio, wl.history_tokens_max
                )
            )
        user = [
            tokens(draw_length(lengths, wl.user_tokens, wl.user_tokens_jitter, distribution))
            for _ in range(turns)
        ]
        outputs = None
        if wl.output_tokens > 0:
            outputs = [
                draw_length(lengths, wl.output_tokens, wl.output_tokens_jitter, distribution)
                for _ in range(turns)
            ]
        edits = {
            t: e
            for t in range(2, turns + 1)
            if (e := edit_for(wl.history_edit, wl.history_edit_share, seed, c, t))
        }
        specs.append(
            ConversationSpec(
                conversation=c,
                prefix=common + own,
                user_turns=user,
                output_lens=outputs,
                edits=edits,
                seed=seed,
            )
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

    def __init__(
        self,
        opts: RequestOptions,
        concurrency: int,
        request_rate: float,
        seed: int,
        arrival: str = "waves",
        burstiness: float = 1.0,
    ):
        self.opts = opts
        self.concurrency = max(1, concurrency)
        self.request_rate = request_rate
        self.arrival = arrival
        self.burstiness = burstiness
        self.seed = seed
        self.rng = random.Random(seed)
        # every answered turn as it ends: what a load cut short (a server died) still has
        self.finished: list[RequestRecord] = []

    @property
    def chat(self) -> bool:
        return self.opts.api == "chat"

    async def prepare(self, specs: list[ConversationSpec]) -> None:
        """Chat: the text of every prefix and user message, from the server's own
        ``/detokenize`` (before the load starts; a no-op for completions or when done)."""
        todo = [s for s in specs if s.user_texts is None]
        if not self.chat or not todo:
            return
        import aiohttp  # lazy: only when requests are sent

        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout, headers=bearer(os.environ)) as session:

            async def text(ids: list[int]) -> str:
                body = {"model": self.opts.model, "tokens": ids}
                async with session.post(f"{self.opts.url}/detokenize", json=body) as resp:
                    if resp.status != 200:
                        raise RuntimeError(
                            f"/detokenize answered {resp.status}: {await resp.text()}"
                        )
                    return (await resp.json())["prompt"]

            for s in todo:
                s.prefix_text = await text(s.prefix) if s.prefix else ""
                s.user_texts = list(await asyncio.gather(*(text(u) for u in s.user_turns)))

    def first_history(self, spec: ConversationSpec) -> list[Message]:
        if not spec.prefix:
            return []
        return [Message(SYSTEM, list(spec.prefix), spec.prefix_text)]

    async def run(
        self,
        specs: list[ConversationSpec],
        on_wave_done: Callable[[int, list[RequestRecord]], Awaitable[None]] | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[RequestRecord]:
        import aiohttp  # lazy: ~0.4 s, only when requests are sent (the driver imports jobs/)

        await self.prepare(specs)
        timeout = aiohttp.ClientTimeout(total=self.opts.timeout_s)
        connector = aiohttp.TCPConnector(limit=0)
        records: list[RequestRecord] = []
        histories = {s.conversation: self.first_history(s) for s in specs}
        alive = {s.conversation for s in specs}
        t0 = time.perf_counter()
        turns = max(len(s.user_turns) for s in specs)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            if self.arrival in OPEN or all(s.offered_s is not None for s in specs):
                records = await self._run_open(session, specs, histories, t0, progress)
                if on_wave_done:
                    await on_wave_done(0, records)
                return records
            for turn in range(1, turns + 1):
                gate = asyncio.Semaphore(self.concurrency)
                wave: list[RequestRecord] = []

                async def one(
                    spec: ConversationSpec, delay: float, turn=turn, gate=gate, wave=wave
                ):
                    await asyncio.sleep(delay)
                    async with gate:
                        rec = await self._turn(session, spec, turn, histories, t0)
                    wave.append(rec)
                    self.finished.append(rec)
                    if rec.status != "ok":
                        alive.discard(spec.conversation)  # its history is unknown from here
                    if progress:
                        progress(1)

                going = [s for s in specs if s.conversation in alive and turn <= len(s.user_turns)]
                delays = self._arrival_delays(len(going))
                await asyncio.gather(*(one(s, d) for s, d in zip(going, delays, strict=True)))
                wave.sort(key=lambda r: r.conversation)
                records.extend(wave)
                if on_wave_done:
                    await on_wave_done(turn, wave)
        return records

    async def _run_open(self, session, specs, histories, t0: float, progress) -> list:
        """Open loop: every turn at its offered time (a trace's, else ``schedule``'s), a
        conversation's turns in order (a turn whose previous one is still unanswered goes
        out when it is)."""
        mine: dict[int, list] = {}
        if all(s.offered_s is not None for s in specs):
            for index, spec in enumerate(specs):
                times = spec.offered_s or []
                mine[index] = [Slot(t, index, turn) for turn, t in enumerate(times, start=1)]
        else:
            slots = schedule(
                [len(s.user_turns) for s in specs],
                self.request_rate,
                self.arrival,
                self.burstiness,
                self.seed,
            )
            for slot in slots:
                mine.setdefault(slot.conversation, []).append(slot)
        records: list[RequestRecord] = []

        async def conversation(index: int, spec: ConversationSpec) -> None:
            for slot in mine.get(index, []):
                wait = slot.at_s - (time.perf_counter() - t0)
                if wait > 0:
                    await asyncio.sleep(wait)
                rec = await self._turn(session, spec, slot.turn, histories, t0)
                rec.offered_s = slot.at_s
                records.append(rec)
                self.finished.append(rec)
                if progress:
                    progress(1)
                if rec.status != "ok":
                    return  # its history is unknown from here

        await asyncio.gather(*(conversation(i, s) for i, s in enumerate(specs)))
        records.sort(key=lambda r: (r.turn, r.conversation))
        return records

    async def _turn(self, session, spec: ConversationSpec, turn: int, histories, t0: float):
        """One turn of one conversation: its history edited first where the workload says
        so, the request, and the reply kept for the next turn."""
        history: list[Message] = histories[spec.conversation]
        edit = spec.edits.get(turn, "")
        if edit and not apply_edit(history, edit, spec.seed):
            edit = ""
        user_ids = spec.user_turns[turn - 1]
        text = spec.user_texts[turn - 1] if spec.user_texts is not None else None
        messages = [*history, Message(USER, user_ids, text)]
        prompt = prompt_ids(messages)
        n_out = spec.output_lens[turn - 1] if spec.output_lens else None
        texts: list[str] = []
        rec = await stream_one(
            session,
            self.opts,
            spec.conversation,
            turn,
            prompt,
            len(prompt) - len(user_ids),
            t0,
            n_out,
            messages=[m.chat() for m in messages] if self.chat else None,
            texts=texts if self.chat else None,
        )
        rec.history_edit = edit
        if self.chat:  # the server's count of the prompt (template included)
            rec.history_tokens = max(0, rec.prompt_tokens - len(user_ids))
        if rec.status == "ok":
            reply = Message(ASSISTANT, rec.output_token_ids, "".join(texts) if self.chat else None)
            histories[spec.conversation] = [*messages, reply]
        return rec

    def _arrival_delays(self, n: int) -> list[float]:
        if self.request_rate <= 0:
            return [0.0] * n
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += self.rng.expovariate(self.request_rate)
        return out
