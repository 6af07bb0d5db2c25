"""The router's ``GET /metrics`` in Prometheus' text format (what AIPerf and GuideLLM scrape).

Counted per answered request, across flow changes (the router's ``/pdbench/stats`` resets
with each flow; these never do): requests by route and HTTP status (``route`` pull,
recompute, recompute_policy, recompute_diverged, recompute_expired, decode_first, agg; a
refused request has route ""; 499: the client left), the router's TTFT (request received ->
the answer's first chunk) and time per streamed chunk after the first (vLLM streams a token
a chunk), and, at each scrape, the turns in flight per prefill instance.
"""

from __future__ import annotations

from typing import Any

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHUNK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class RouterMetrics:
    """The router's Prometheus registry (``prometheus_client``, a vLLM dependency)."""

    def __init__(self, in_flight: dict[str, int], prefill_urls: list[str]):
        from prometheus_client import (  # lazy: only the router process serves metrics
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
        )

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "pdbench_router_requests",
            "Requests answered, by route and HTTP status",
            ["route", "status"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "pdbench_router_ttft_seconds",
            "Request received -> the answer's first chunk, as the router saw it",
            ["route"],
            buckets=TTFT_BUCKETS_S,
            registry=self.registry,
        )
        self.per_chunk = Histogram(
            "pdbench_router_time_per_chunk_seconds",
            "Streamed answers: (last chunk - first chunk) / (chunks - 1)",
            ["route"],
            buckets=CHUNK_BUCKETS_S,
            registry=self.registry,
        )
        gauge = Gauge(
            "pdbench_router_in_flight",
            "Turns in flight per prefill instance (the policy flow's load)",
            ["prefill"],
            registry=self.registry,
        )
        for i, url in enumerate(prefill_urls):
            gauge.labels(prefill=f"prefill{i}").set_function(
                lambda url=url: float(in_flight.get(url, 0))
            )

    def observe(self, route: str, status: int, ttft_s: float, chunks: int, span_s: float):
        """One answered request (``ttft_s`` < 0: no answer began; ``chunks``: streamed
        chunks, ``span_s`` first to last)."""
        self.requests.labels(route=route, status=str(status)).inc()
        if status == 200 and ttft_s >= 0:
            self.ttft.labels(route=route).observe(ttft_s)
            if chunks > 1:
                self.per_chunk.labels(route=route).observe(span_s / (chunks - 1))

    def exposition(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # lazy: as above

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def metrics_urls(router_url: str, instances: list[Any]) -> dict[str, str]:
    """Where to scrape a deployment, by name: the router's and each vLLM server's
    ``/metrics``."""
    return {"router": f"{router_url}/metrics", **{i.name: f"{i.url}/metrics" for i in instances}}
