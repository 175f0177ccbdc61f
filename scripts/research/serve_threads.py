"""CPU seconds of each ``kvtrim serve`` thread (and of this client) while N clients send
distinct ~64-token completions of 64 answer tokens with ``ignore_eos``, plain and
streamed, alternating: what streaming adds on the event loop, per token.

    .venv/bin/python scripts/research/serve_threads.py --clients 1
    .venv/bin/python scripts/research/serve_threads.py --clients 8

Linux only (``/proc``). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pool_ab import start_server  # noqa: E402

from engine.bench.texts import window  # noqa: E402

TOKENS = 64


def _threads(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _request(url: str, i: int, stream: bool) -> None:
    body = {"prompt": window(20_000 * i + 7, 280) + "\n\nIn short,", "max_tokens": TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": stream}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for _ in reply.iter_lines():
            pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=1, help="clients, and --parallel")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    server, url = start_server(["--parallel", str(args.clients)])
    try:
        _request(url, 0, True)
        _request(url, 1, False)
        ids = range(2, 2 + args.requests)
        with ThreadPoolExecutor(args.clients) as pool:
            for r in range(args.rounds):
                for stream in (False, True):
                    before, mine = _threads(server.pid), resource.getrusage(resource.RUSAGE_SELF)
                    start = time.perf_counter()
                    list(pool.map(lambda i, s=stream: _request(url, i, s), ids))
                    wall = time.perf_counter() - start
                    after, done = _threads(server.pid), resource.getrusage(resource.RUSAGE_SELF)
                    used = sorted((v - before.get(t, 0.0) for t, v in after.items()), reverse=True)
                    client = done.ru_utime + done.ru_stime - mine.ru_utime - mine.ru_stime
                    rest = ", ".join(f"{s:.2f}" for s in used[:4])
                    print(f"round {r} {'streamed' if stream else 'plain'}: wall {wall:.2f} s, "
                          f"client {client:.2f} s, server threads {rest} s "
                          f"(the {args.requests * TOKENS} answer tokens)", flush=True)  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
