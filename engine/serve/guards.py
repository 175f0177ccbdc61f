"""ASGI middleware that refuses a request before the app reads its body: a Host
header the server does not answer to (DNS rebinding), a missing or wrong API key
(every path, the docs included), a body over the size limit. Refusals are in
OpenAI's error shape.

>>> app.add_middleware(BodyLimit, max_bytes=16 * 2**20)
>>> app.add_middleware(KeyCheck, key="sk-...")
>>> app.add_middleware(HostCheck, allowed=LOOPBACK_HOSTS)
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .schemas import error_body

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")  # listen on every interface: no name of its own

BODY_TIMEOUT_S = 60.0  # a request body, whole, from the request's start (16 MiB at 280 KB/s)
OnRefuse = Callable[[str], None]  # called with the kind of refusal (for metrics)


async def _refuse(
    scope: Scope, receive: Receive, send: Send, status: int, message: str, code: str
) -> None:
    body = error_body(message, "invalid_request_error", code)
    await JSONResponse(body, status)(scope, receive, send)


def host_name(header: str | None) -> str | None:
    """The host of a Host header, lower case, without port or IPv6 brackets;
    None when it is missing or malformed."""
    if not header:
        return None
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal: [::1]:8000
        name, closed, rest = header[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = header.partition(":")
    if not name or (port and not port.isdigit()):
        return None
    return name.rstrip(".")


def allowed_names(allowed: Iterable[str]) -> frozenset[str]:
    """Host names as ``host_allowed`` compares them: lower case, no IPv6 brackets
    or trailing dot."""
    return frozenset(name.strip("[]").lower().rstrip(".") for name in allowed)


def host_allowed(header: str | None, allowed: frozenset[str]) -> bool:
    """Whether a Host header names one of ``allowed`` (see ``allowed_names``);
    ``"*"`` allows any, even a missing or malformed header."""
    return "*" in allowed or host_name(header) in allowed


def key_matches(authorization: str, key: bytes) -> bool:
    """Whether an Authorization header is ``Bearer <key>`` (compared in constant time)."""
    given = authorization.removeprefix("Bearer ").strip().encode()
    return secrets.compare_digest(given, key)


class HostCheck:
    """Answers 400 unless the Host header names an allowed host (``"*"``
    allows any): a web page reached through DNS rebinding sends its own name,
    so it cannot call a server that answers only to loopback names."""

    def __init__(
        self, app: ASGIApp, allowed: Iterable[str], on_refuse: OnRefuse | None = None
    ) -> None:
        self.app = app
        self.allowed = allowed_names(allowed)
        self.on_refuse = on_refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = Headers(scope=scope).get("host")
            if not host_allowed(header, self.allowed):
                if self.on_refuse is not None:
                    self.on_refuse("invalid_host")
                message = f"this server does not answer to the host {header!r}"
                await _refuse(scope, receive, send, 400, message, "invalid_host")
                return
        await self.app(scope, receive, send)


OPEN_PATHS = frozenset({"/health"})  # answered without the API key, as llama-server does


class KeyCheck:
    """Answers 401 unless the request carries ``Authorization: Bearer <key>`` (every
    path but ``OPEN_PATHS``)."""

    def __init__(self, app: ASGIApp, key: str, on_refuse: OnRefuse | None = None) -> None:
        self.app = app
        self.key = key.encode()
        self.on_refuse = on_refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in OPEN_PATHS:
            header = Headers(scope=scope).get("authorization", "")
            if not key_matches(header, self.key):
                if self.on_refuse is not None:
                    self.on_refuse("authentication")
                message = "Incorrect API key provided."
                await _refuse(scope, receive, send, 401, message, "invalid_api_key")
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuses a request body over ``max_bytes``: at once when Content-Length
    says so, else as soon as the bytes read pass it (a chunked upload); and one
    that has not arrived whole ``max_seconds`` after the request began (a client
    sending a byte a second holds a connection and a task). The refusal is an
    ``HTTPException`` (413, 408) raised where the app reads the body, so the app's
    own handler answers it."""

    def __init__(self, app: ASGIApp, max_bytes: int, max_seconds: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        # h11 holds a body to its Content-Length; without one (chunked), count
        over = declared.isdigit() and int(declared) > self.max_bytes
        seen, whole = 0, False
        deadline = asyncio.get_running_loop().time() + self.max_seconds

        async def limited() -> Message:
            nonlocal seen, whole
            if over:
                raise self._too_large()
            if whole:  # the body is in: what comes now is a disconnect, whenever
                return await receive()
            left = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except asyncio.TimeoutError:
                raise self._too_slow() from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                whole = not message.get("more_body", False)
                if seen > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited, send)

    def _too_slow(self) -> HTTPException:
        return HTTPException(
            408, f"the request body did not arrive within {self.max_seconds:g} seconds"
        )

    def _too_large(self) -> HTTPException:
        mib = self.max_bytes / 2**20
        return HTTPException(413, f"the request body is over this server's {mib:g} MiB limit")
