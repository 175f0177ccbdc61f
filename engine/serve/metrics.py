"""Prometheus metrics of the server (prometheus_client, one registry per server).

Units are in the names: ``*_bytes`` bytes, ``*_ratio`` a fraction, ``*_per_second``
tokens per second.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Summary,
    disable_created_metrics,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..stats import KVStats


class Metrics:
    """What the server counts; ``render()`` gives the text exposition format."""

    def __init__(self) -> None:
        disable_created_metrics()  # no *_created series: one timestamp each, of no use here
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvtrim_requests",
            "HTTP requests by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter("kvtrim_prompt_tokens", "Tokens read", registry=r)
        self.completion_tokens = Counter("kvtrim_completion_tokens", "Tokens generated", registry=r)
        self.evictions = Counter("kvtrim_evictions", "Cache trims", registry=r)
        self.evicted_tokens = Counter("kvtrim_evicted_tokens", "Tokens evicted", registry=r)
        self.retention = Summary(
            "kvtrim_retention_ratio", "Per request: cells kept / tokens seen", registry=r
        )
        self.retention_mean = Gauge(
            "kvtrim_retention_ratio_mean", "Mean retention ratio over requests", registry=r
        )
        self.kv_bytes_held = Gauge(
            "kvtrim_kv_bytes_held", "KV cache allocated by the last request", registry=r
        )
        self.kv_bytes_llama_default = Gauge(
            "kvtrim_kv_bytes_llama_default",
            "KV llama.cpp's default context (sliding-window layers at window + batch cells) "
            "would allocate for the last request's tokens",
            registry=r,
        )
        self.kv_bytes_full = Gauge(
            "kvtrim_kv_bytes_full",
            "KV a cache with a cell per token in every layer (swa_full) would have needed "
            "for the last request's tokens",
            registry=r,
        )
        self.prefill_speed = Summary(
            "kvtrim_prefill_tokens_per_second", "Prompt reading speed per request", registry=r
        )
        self.decode_speed = Summary(
            "kvtrim_decode_tokens_per_second", "Generation speed per request", registry=r
        )
        self.errors = Counter("kvtrim_errors", "Errors by kind", ["kind"], registry=r)
        self.queue = Gauge("kvtrim_queue_depth", "Requests queued or running", registry=r)
        self._ratios = 0.0
        self._count = 0

    def finished(self, stats: KVStats) -> None:
        """One request's figures."""
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.completion_tokens.inc(stats.generated_tokens)
        self.evictions.inc(stats.evictions)
        self.evicted_tokens.inc(stats.evicted_tokens)
        ratio = stats.cells_used / stats.tokens_seen if stats.tokens_seen else 1.0
        self.retention.observe(ratio)
        self._ratios += ratio
        self._count += 1
        self.retention_mean.set(self._ratios / self._count)
        self.kv_bytes_held.set(stats.kv_bytes)
        self.kv_bytes_llama_default.set(stats.kv_bytes_llama_default)
        self.kv_bytes_full.set(stats.kv_bytes_full)
        if stats.prefill_s > 0:
            self.prefill_speed.observe(stats.prefill_tokens_per_s)
        if stats.decode_s > 0:
            self.decode_speed.observe(stats.decode_tokens_per_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountRequests:
    """ASGI middleware: counts each HTTP request by route and status. Plain
    ASGI, not Starlette's ``BaseHTTPMiddleware``, whose receive wrapper hides a
    client's disconnect from ``Request.is_disconnected``."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app fails before it answers

        async def seen(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, seen)
        finally:
            endpoint = getattr(scope.get("route"), "path", "unmatched")  # no label per path
            self.counter.labels(endpoint, str(status)).inc()
