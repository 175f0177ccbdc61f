"""kvtrim serve's throughput under server options, alternating in one run: 16
distinct ~170-token completions of 32 greedy tokens from N clients after a 3-request
warm-up (``--chars``, ``--max-tokens``: another mix), and the pool's /metrics after
(decode steps, llama_decode seconds, the seconds decodes waited for Python).

    .venv/bin/python scripts/research/pool_ab.py --rounds 2 \\
        --variant "" --variant "--kv-layout streams"

Each variant is a string of extra ``kvtrim serve`` options. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench.texts import window  # noqa: E402

METRICS = ("kvtrim_pool_decode_steps ", "kvtrim_pool_batch_tokens_mean ",
           "kvtrim_pool_decode_seconds ", "kvtrim_pool_owed_seconds ")  # fmt: skip


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(options: list[str], root: Path = ROOT) -> tuple[subprocess.Popen[bytes], str]:
    """``kvtrim serve`` from the source tree ``root`` on a free port, 2 threads, 2,048
    pool cells, budget 512, then ``options``; once /health answers: it and its URL."""
    port = _port()
    cmd = [sys.executable, "-m", "app.main", "serve", "--port", str(port), "--threads", "2",
           "--kv-cells", "2048", "--budget", "512", *options]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(root))
    server = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url)
    return server, url


def passages(count: int, chars: int = 700) -> list[str]:
    """``count`` distinct passages of the corpus, each ``chars`` characters (700: about
    160 tokens) ending "In short,": the research scripts' prompts."""
    return [window(20_000 * i + 7, chars) + "\n\nIn short," for i in range(count)]


def wait_ready(url: str) -> None:
    """Until the server at ``url`` answers /health (at most about 2 minutes)."""
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)


def _send(
    url: str,
    prompts: list[str],
    clients: int,
    max_tokens: int = 32,
    stream: bool = False,
    ignore_eos: bool = False,
) -> int:
    """Send ``prompts`` from ``clients`` threads; the answer tokens they got."""

    def one(prompt: str) -> int:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if ignore_eos:
            body["ignore_eos"] = True
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
            reply.raise_for_status()
            lines = [ln for ln in reply.iter_lines() if ln.startswith(("{", "data: {"))]
        usage = json.loads(lines[-1].removeprefix("data: "))["usage"]
        return int(usage["completion_tokens"])

    with ThreadPoolExecutor(clients) as pool:
        return sum(pool.map(one, prompts))


def run(
    extra: list[str],
    parallel: int,
    clients: int,
    n: int = 16,
    chars: int = 700,
    out: int = 32,
    stream: bool = False,
    ignore_eos: bool = False,
) -> str:
    """One server start: requests/s and the pool's figures, as one line."""
    server, url = start_server(["--parallel", str(parallel), *extra])
    try:
        prompts = passages(n + 3, chars)
        _send(url, prompts[n:], clients, out, stream, ignore_eos)  # warm-up
        start = time.perf_counter()
        tokens = _send(url, prompts[:n], clients, out, stream, ignore_eos)
        seconds = time.perf_counter() - start
        rate = n / seconds
        metrics = httpx.get(f"{url}/metrics", timeout=5).text.splitlines()
        pool = [ln for ln in metrics if ln.startswith(METRICS)]
        return f"{rate:.2f} req/s  {tokens / seconds:.1f} answer tok/s  " + "  ".join(pool)
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", default=[], help="extra serve options")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--parallel", type=int, default=8)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--chars", type=int, default=700, help="prompt characters (700: ~160 tokens)")
    p.add_argument("--max-tokens", type=int, default=32, help="answer tokens a request asks")
    p.add_argument("--stream", action="store_true", help="streamed requests (server-sent events)")
    p.add_argument("--ignore-eos", action="store_true", help="every answer runs to its length")
    args = p.parse_args()
    for r in range(args.rounds):
        for variant in args.variant or [""]:
            line = run(
                shlex.split(variant),
                args.parallel,
                args.clients,
                chars=args.chars,
                out=args.max_tokens,
                stream=args.stream,
                ignore_eos=args.ignore_eos,
            )
            print(f"round {r} [{variant or 'defaults'}]: {line}", flush=True)


if __name__ == "__main__":
    main()
