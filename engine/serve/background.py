"""uvicorn's server told when shutdown begins (``Server``), and the server on a
free loopback port in a background thread (``BackgroundServer``: tests, load tests)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from .connections import GuardedH11, close_waiting


class Server(uvicorn.Server):
    """Calls ``on_shutdown`` as soon as shutdown begins, before uvicorn waits
    for the open requests (its lifespan shutdown comes only after they end),
    so the app can cancel work nobody will wait for."""

    def __init__(
        self, config: uvicorn.Config, on_shutdown: Callable[[], None] | None = None
    ) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_shutdown is not None:
            self.on_shutdown()
        close_waiting(self.server_state)  # nothing to answer there; do not wait for them
        await super().shutdown(sockets)


def uvicorn_config(app: Any, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration with kvtrim's connection rules (see connections.py)."""
    return uvicorn.Config(app, http=GuardedH11, **options)


class BackgroundServer:
    """``with BackgroundServer(app) as url:`` serves ``app`` until the block ends;
    ``app.state.on_shutdown``, if set, is called when it starts to stop."""

    def __init__(self, app: Any, start_timeout_s: float = 20.0, **options: Any) -> None:
        """``options``: uvicorn's (``limit_concurrency``, say)."""
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        settings = uvicorn_config(app, **{"log_level": "warning", **options})
        self._server = Server(settings, getattr(getattr(app, "state", None), "on_shutdown", None))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._timeout_s = start_timeout_s

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.05)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(self._timeout_s)
        self._sock.close()
