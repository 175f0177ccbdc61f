"""Connections that send nothing useful cannot lock anyone out.

uvicorn counts every open connection against ``--max-connections`` and bounds no
request head: 70 connections sending headers at a byte a second made every request,
with the right API key too, a 503 for as long as they lasted (issue 23, FAIL 8).
``GuardedH11`` (uvicorn's h11 protocol with two rules) fixes that:

- a connection counts against ``--max-connections`` only while a request is being
  answered, not while it is idle or its request head is still arriving;
- a request head must arrive whole within ``HEAD_TIMEOUT_S`` of the connection
  opening (or of the previous response), else the connection is closed; at most
  ``MAX_WAITING`` connections wait for a head at once, and the oldest is closed first.

The body is bounded in ``guards.BodyLimit`` (size and time). What a local server
promises beyond this (TLS, per-client rate limits, slow-read clients) belongs to a
reverse proxy in front of it (docs/server.md, "Limits and security"). Times in seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0  # a request line and headers, from the connection's start
MAX_WAITING = 1024  # connections without a request head, at most


def _waiting(server_state: Any) -> dict[GuardedH11, None]:
    """The server's connections that wait for a request head, oldest first."""
    if not hasattr(server_state, "kvtrim_waiting"):
        server_state.kvtrim_waiting = {}
    return server_state.kvtrim_waiting  # type: ignore[no-any-return]


def close_waiting(server_state: Any) -> None:
    """Close every connection that waits for a request head (at shutdown)."""
    for protocol in list(_waiting(server_state)):
        protocol.transport.close()


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol; counted in ``server_state.connections`` only while a
    request runs, and closed when a request head takes over ``HEAD_TIMEOUT_S``."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_waiting = MAX_WAITING

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        self._wait_for_head()

    def data_received(self, data: bytes) -> None:
        cycle = self.cycle
        if self in _waiting(self.server_state):
            self.connections.add(self)  # as uvicorn counts it, if this completes a head
        super().data_received(data)
        if self.cycle is not cycle:  # a request head arrived whole
            self._stop_waiting()
        elif self in _waiting(self.server_state):
            self.connections.discard(self)

    def on_response_complete(self) -> None:
        cycle = self.cycle
        super().on_response_complete()
        if self.cycle is cycle and not self.transport.is_closing():
            self._wait_for_head()  # idle until the next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _wait_for_head(self) -> None:
        self.connections.discard(self)
        waiting = _waiting(self.server_state)
        waiting[self] = None
        while len(waiting) > self.max_waiting:
            oldest = next(iter(waiting))
            waiting.pop(oldest)
            oldest.transport.close()
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.head_timeout_s, self._too_slow)

    def _stop_waiting(self) -> None:
        _waiting(self.server_state).pop(self, None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self in _waiting(self.server_state) and not self.transport.is_closing():
            self.transport.close()
