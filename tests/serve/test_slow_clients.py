"""Slow and idle connections cannot lock anyone out of the server (issue 23, FAIL 8):
70 connections sending headers at a byte a second made every request a 503, with the
right API key too. A small ASGI app behind kvtrim's guards; no model."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from engine.serve.background import BackgroundServer
from engine.serve.connections import GuardedH11
from engine.serve.guards import BodyLimit

LIMIT = 8  # --max-connections


async def _models(request: Request) -> JSONResponse:
    return JSONResponse({"data": [{"id": "m"}]})


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


@pytest.fixture
def url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(GuardedH11, "head_timeout_s", 1.5)
    app = Starlette(routes=[Route("/v1/models", _models), Route("/echo", _echo, methods=["POST"])])
    guarded = BodyLimit(app, max_bytes=2**20, max_seconds=1.0)
    with BackgroundServer(guarded, limit_concurrency=LIMIT) as served:
        yield served


def _open(url: str, n: int, first: bytes) -> list[socket.socket]:
    """``n`` connections that sent ``first`` and then nothing."""
    where = urlparse(url)
    socks = []
    for _ in range(n):
        s = socket.create_connection((where.hostname, where.port), timeout=5)
        s.sendall(first)
        socks.append(s)
    return socks


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.2)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_slow_request_heads_do_not_use_up_the_connections(url):
    slow = _open(url, 3 * LIMIT, b"GET /v1/models HTTP/1.1\r\nHo")
    try:
        start = time.monotonic()
        response = httpx.get(f"{url}/v1/models", timeout=5)
        assert response.status_code == 200, response.text  # uvicorn alone: 503
        assert time.monotonic() - start < 1.0
        time.sleep(2.0)  # past the head deadline
        assert all(_closed_by_server(s) for s in slow)
    finally:
        for s in slow:
            s.close()


def test_idle_connections_are_not_counted_and_a_silent_one_is_closed(url):
    idle = _open(url, 2 * LIMIT, b"")  # opened, never a byte
    try:
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
        time.sleep(2.0)
        assert all(_closed_by_server(s) for s in idle)
    finally:
        for s in idle:
            s.close()


def test_keep_alive_connections_between_requests_are_not_counted(url):
    clients = [httpx.Client(timeout=5) for _ in range(2 * LIMIT)]
    try:
        for c in clients:  # each keeps its connection open after its answer
            assert c.get(f"{url}/v1/models").status_code == 200
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
        assert all(c.get(f"{url}/v1/models").status_code == 200 for c in clients[:3])
    finally:
        for c in clients:
            c.close()


def test_a_body_that_trickles_is_refused_with_408(url):
    (s,) = _open(url, 1, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123")
    try:
        s.settimeout(5)
        start = time.monotonic()
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        while b"seconds" not in reply and (more := s.recv(4096)):
            reply += more
        assert b"did not arrive within 1 seconds" in reply
        assert 0.9 < time.monotonic() - start < 3
    finally:
        s.close()
    whole = httpx.post(f"{url}/echo", content=b"x" * 5000, timeout=5)
    assert whole.json() == {"bytes": 5000}


def test_waiting_connections_are_bounded_oldest_first(url, monkeypatch):
    monkeypatch.setattr(GuardedH11, "max_waiting", 4)
    socks = _open(url, 8, b"GET /v1/models HTTP/1.1\r\n")
    try:
        time.sleep(0.3)
        closed = [_closed_by_server(s) for s in socks]
        assert closed == [True] * 4 + [False] * 4
    finally:
        for s in socks:
            s.close()
