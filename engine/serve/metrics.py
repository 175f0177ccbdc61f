"""Prometheus metrics of the server (prometheus_client, one registry per server).

Units are in the names: ``*_bytes`` bytes, ``*_ratio`` a fraction, ``*_per_second``
tokens per second.
"""

from __future__ import annotations

from typing import Any

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
        self._pool_metrics(r)
        self.pool_cells: int | None = None  # set when requests share a pool
        self._ratios = 0.0
        self._count = 0

    def _pool_metrics(self, r: CollectorRegistry) -> None:
        """Parallel requests (engine/pool/kvpool.py): the pool, and each sequence by its id."""
        self.pool_cells_gauge = Gauge("kvtrim_pool_cells", "KV cells shared", registry=r)
        self.pool_reserved = Gauge(
            "kvtrim_pool_reserved_cells", "KV cells promised to running requests", registry=r
        )
        self.pool_kept = Gauge(
            "kvtrim_pool_kept_sequences",
            "Finished requests' sequences kept with their text for a next request",
            registry=r,
        )
        self.pool_active = Gauge(
            "kvtrim_pool_active_sequences", "Requests running in the pool", registry=r
        )
        self.pool_batch = Gauge(
            "kvtrim_pool_batch_tokens_mean", "Tokens per llama_decode, mean", registry=r
        )
        self.pool_steps = Gauge("kvtrim_pool_decode_steps", "llama_decode calls", registry=r)
        self.pool_tokens = Gauge(
            "kvtrim_pool_decode_tokens", "Tokens the pool's llama_decode calls held", registry=r
        )
        self.pool_decode_s = Gauge(
            "kvtrim_pool_decode_seconds",
            "Seconds the pool's llama_decode calls took, in all (the rest of a request's "
            "time is waiting, reading attention, scoring and sampling)",
            registry=r,
        )
        self.pool_owed_s = Gauge(
            "kvtrim_pool_owed_seconds",
            "Seconds the next llama_decode waited for the sequences the last one answered "
            "(sampling, stop checks, evictions: Python between decodes) and for short "
            "requests the server was parsing, in all",
            registry=r,
        )
        labels = ["seq"]
        self.seq_share = Gauge(
            "kvtrim_sequence_share_cells", "KV cells a running request may hold", labels, registry=r
        )
        self.seq_share_ratio = Gauge(
            "kvtrim_sequence_share_ratio", "A request's share of the pool", labels, registry=r
        )
        self.seq_cells = Gauge(
            "kvtrim_sequence_cells_used", "KV cells a running request holds", labels, registry=r
        )
        self.seq_retention = Gauge(
            "kvtrim_sequence_retention_ratio",
            "A running request's cells kept / tokens seen",
            labels,
            registry=r,
        )
        self.seq_evicted = Gauge(
            "kvtrim_sequence_evicted_tokens", "Tokens a running request evicted", labels, registry=r
        )
        self.seq_evictions = Gauge(
            "kvtrim_sequence_evictions", "Cache trims of a running request", labels, registry=r
        )
        self.share = Summary(
            "kvtrim_request_share_ratio", "Per request: its share of the pool's cells", registry=r
        )

    def pool(self, snapshot: dict[str, Any]) -> None:
        """The pool's state now (``KVPool.snapshot``)."""
        self.pool_cells_gauge.set(snapshot["cells"])
        self.pool_reserved.set(snapshot["reserved_cells"])
        self.pool_active.set(snapshot["active"])
        self.pool_kept.set(snapshot.get("kept", 0))
        self.pool_batch.set(snapshot["mean_batch_tokens"])
        self.pool_steps.set(snapshot["steps"])
        self.pool_tokens.set(snapshot.get("tokens", 0))
        self.pool_decode_s.set(snapshot.get("decode_s", 0.0))
        self.pool_owed_s.set(snapshot.get("owed_s", 0.0))
        per_seq = (
            self.seq_share,
            self.seq_share_ratio,
            self.seq_cells,
            self.seq_retention,
            self.seq_evicted,
            self.seq_evictions,
        )
        for gauge in per_seq:
            gauge.clear()  # finished requests leave
        for seq in snapshot["sequences"]:
            key = str(seq["seq"])
            self.seq_share.labels(key).set(seq["share_cells"])
            self.seq_share_ratio.labels(key).set(seq["share"])
            self.seq_cells.labels(key).set(seq["cells_used"])
            self.seq_retention.labels(key).set(seq["retention"])
            self.seq_evicted.labels(key).set(seq["evicted_tokens"])
            self.seq_evictions.labels(key).set(seq["evictions"])

    def finished(self, stats: KVStats) -> None:
        """One request's figures."""
        if self.pool_cells:
            self.share.observe(stats.n_ctx / self.pool_cells)
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
