"""Where ``kvtrim serve``'s time goes (issue 24, item 2): a server subprocess under
py-spy (native frames too) while N clients send 16 distinct ~160-token completions of
32 greedy tokens; prints the functions with the most samples, inclusive and self.

    .venv/bin/python scripts/research/serve_profile.py --clients 1 --parallel 1
    .venv/bin/python scripts/research/serve_profile.py --clients 8 --parallel 8

Run it alone on the machine (llama.cpp's threads spin while they wait).
"""

from __future__ import annotations

import argparse
import collections
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from engine.bench.texts import window


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"the server did not start on {url}")


def _load(url: str, clients: int, requests: int, stream: bool = False) -> float:
    prompts = [window(20_000 * i, 700) + "\n\nIn short," for i in range(requests)]

    def one(prompt: str) -> None:
        body = {"prompt": prompt, "max_tokens": 32, "temperature": 0, "stream": stream}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as r:
            r.raise_for_status()
            for _ in r.iter_lines():
                pass

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, prompts))
    return requests / (time.perf_counter() - start)


def _top(raw: Path, n: int) -> None:
    """Functions by samples, from py-spy's raw (collapsed) stacks."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f.split(" (")[0] for f in stack.split(";")]
        k = int(count)
        total += k
        own[frames[-1]] += k
        for f in set(frames):
            inclusive[f] += k
    print(f"{total} samples")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        print(f"-- {title}")
        for name, k in counter.most_common(n):
            print(f"{100 * k / total:5.1f}%  {name}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--stream", action="store_true", help="streamed (server-sent events)")
    p.add_argument("--gil", action="store_true", help="only samples of the thread holding the GIL")
    args = p.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "app.main", "serve", "--port", str(port)]
    cmd += ["--threads", str(args.threads), "--parallel", str(args.parallel)]
    cmd += ["--kv-cells", "2048", "--budget", "512"]
    server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    raw = Path(tempfile.mkdtemp()) / "profile.txt"
    try:
        _wait(url)
        _load(url, args.clients, 3)  # warm-up
        spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--threads",
             *(["--gil"] if args.gil else ["--native"]),
             "--format", "raw", "--rate", "200", "-o", str(raw), "--pid", str(server.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)
        rate = _load(url, args.clients, args.requests, args.stream)
        spy.send_signal(2)
        spy.wait(60)
        print(f"{rate:.2f} requests/s with {args.clients} clients, --parallel {args.parallel}")
        _top(raw, args.top)
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
