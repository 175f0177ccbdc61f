"""The server on a free loopback port in a background thread (tests, load tests)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class BackgroundServer:
    """``with BackgroundServer(app) as url:`` serves ``app`` until the block ends."""

    def __init__(self, app: Any, start_timeout_s: float = 20.0) -> None:
        import uvicorn

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
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
