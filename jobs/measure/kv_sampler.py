"""Sample servers' KV-cache occupancy every ~0.5 s while a Point runs, and after it.

Why: with bidirectional pull, D keeps a finished request's blocks for
``decoder_kv_blocks_ttl`` seconds (until P pulls them, or the TTL runs out), so D's
``vllm:kv_cache_usage_perc`` stays up between turns and after the last one. Scraping
between waves alone misses that: the shape over time (and how long it stays up after the
load ended) is the decode node's KV bill. ``jobs.measure.decode_bill`` turns the samples into
block-seconds.

One sample per instance: ``[t_s, usage, running, expired]``: seconds since ``start``,
``vllm:kv_cache_usage_perc`` (0..1 of the blocks vLLM can hand out), requests running, and
``vllm:nixl_num_kv_expired_reqs_total`` (requests whose held blocks ran out of lease).
"""

from __future__ import annotations

import asyncio
import re
import time

from jobs.measure import metrics

SAMPLE_PERIOD_S = 0.5
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"
_NUM_BLOCKS = re.compile(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', re.MULTILINE)


def num_gpu_blocks(metrics_text: str) -> int:
    """The KV blocks a server has (``vllm:cache_config_info``'s label), 0 when absent."""
    found = _NUM_BLOCKS.search(metrics_text)
    return int(found.group(1)) if found else 0


def sample_row(t_s: float, scraped: dict[str, float]) -> list[float]:
    return [
        round(t_s, 3),
        scraped.get("vllm:kv_cache_usage_perc", 0.0),
        scraped.get("vllm:num_requests_running", 0.0),
        scraped.get(EXPIRED, 0.0),
    ]


def settled(
    samples: list[list[float]], baseline: float, since_s: float = 0.0, tolerance: float = 1e-6
) -> bool:
    """The newest sample, taken at ``since_s`` or later, has usage back at (or under) its
    level before the Point and nothing running."""
    if not samples:
        return False
    t_s, usage, running, *_ = samples[-1]
    return t_s >= since_s and usage <= baseline + tolerance and running == 0


class KvSampler:
    """Samples ``urls`` (instance name -> base URL) every ``period_s`` in the background.

    ``await start()``, run the load, ``await stop()``. With ``tail_s`` > 0, ``start`` first
    waits (at most ``tail_s``) for the ``watch`` instances to hold nothing (blocks kept from
    the warm-up or an earlier Point run out), and ``stop`` samples on after the load until
    they are back at their starting usage with nothing running, or ``tail_s`` has passed:
    the TTL's tail. Only samples taken a period after the load's end count there: one
    taken during the load may predate the blocks it left held (a CI run's sampler saw 0
    at 0.5 s, stopped at 1.0 s, and D still held 10 blocks). ``timeline`` and ``blocks``
    hold what was seen.
    """

    def __init__(
        self,
        session,
        urls: dict[str, str],
        period_s: float = SAMPLE_PERIOD_S,
        watch: list[str] | None = None,
        tail_s: float = 0.0,
    ):
        self.session = session
        self.urls = dict(urls)
        self.period_s = period_s
        self.watch = [n for n in (watch or []) if n in urls]
        self.tail_s = tail_s
        self.timeline: dict[str, list[list[float]]] = {name: [] for name in urls}
        self.blocks: dict[str, int] = {}
        self.load_end_s = 0.0
        self._t0 = 0.0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        for name, url in self.urls.items():
            async with self.session.get(f"{url}/metrics") as resp:
                self.blocks[name] = num_gpu_blocks(await resp.text())
        if self.tail_s > 0:
            await self._until_settled({n: 0.0 for n in self.watch}, self.tail_s)
            self.timeline = {name: [] for name in self.urls}
        self._t0 = time.perf_counter()
        await self._sample()
        self._task = asyncio.create_task(self._run())

    async def cancel(self) -> None:
        """Stop sampling without a last sample (a server died: asking it would wait out
        the session's timeout)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def stop(self) -> dict[str, list[list[float]]]:
        self.load_end_s = time.perf_counter() - self._t0
        if self.tail_s > 0:
            baselines = {n: self.timeline[n][0][1] for n in self.watch if self.timeline[n]}
            await self._until_settled(baselines, self.tail_s, self.load_end_s + self.period_s)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._sample()
        return self.timeline

    async def _until_settled(
        self, baselines: dict[str, float], wait_s: float, since_s: float = 0.0
    ) -> None:
        deadline = time.perf_counter() + wait_s
        while time.perf_counter() < deadline:
            if self._task is None:  # not started: sample here
                await self._sample()
            if all(settled(self.timeline[n], b, since_s) for n, b in baselines.items()):
                return
            await asyncio.sleep(self.period_s)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period_s)
            await self._sample()

    async def _sample(self) -> None:
        names = list(self.urls)
        got = await asyncio.gather(
            *(metrics.scrape_async(self.session, self.urls[n]) for n in names),
            return_exceptions=True,
        )
        t_s = time.perf_counter() - self._t0
        for name, scraped in zip(names, got, strict=True):
            if isinstance(scraped, BaseException):
                continue  # a server gone or slow: a gap in its timeline, not a failed Point
            self.timeline[name].append(sample_row(t_s, scraped))


async def start(
    session, urls: dict[str, str], period_s: float, watch: list[str], tail_s: float
) -> KvSampler | None:
    """A running sampler of ``urls`` every ``period_s`` (None when ``period_s`` is 0: off);
    ``watch`` (the decode instances) and ``tail_s`` as in ``KvSampler``."""
    if period_s <= 0:
        return None
    sampler = KvSampler(session, urls, period_s, watch, tail_s)
    await sampler.start()
    return sampler
