"""A JSON-over-HTTP server in a thread on a loopback port, for tests that stand in
for llama-server or an OpenAI-style endpoint: ``reply(path, body)`` returns the
status and the JSON object to answer a POST with; every request is recorded."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

Reply = Callable[[str, Any], tuple[int, Any]]


class JsonServer:
    """Serves until ``close()``; ``requests``: ``(path, body)`` of each POST in order."""

    def __init__(self, reply: Reply) -> None:
        requests: list[tuple[str, Any]] = []
        self.requests = requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                requests.append((self.path, body))
                status, out = reply(self.path, body)
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                return None

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
