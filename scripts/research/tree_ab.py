"""Two source trees' ``kvtrim serve`` (a commit and its parent, as git worktrees),
alternating in one run: N clients (streaming, or ``--plain``) send 16 distinct
~160-token completions, after a 3-request warm-up; each server start prints
requests/s and the p50 of the time to the first streamed token and of the latency.

    git worktree add /tmp/before HEAD~1
    .venv/bin/python scripts/research/tree_ab.py /tmp/before . --clients 8 --rounds 3
    .venv/bin/python scripts/research/tree_ab.py /tmp/before . --clients 8 --rounds 6 --plain
    .venv/bin/python scripts/research/tree_ab.py /tmp/before . --chars 1750 --max-tokens 4 \\
        --serve-args "--kv-cells 6144 --kv-layout streams"

Run it alone on the machine (llama.cpp's threads spin while they wait).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pool_ab import passages, start_server  # noqa: E402


def _one(url: str, prompt: str, options: dict[str, Any]) -> tuple[float, float]:
    """One greedy completion with ``options`` (its length, streaming or not): seconds to
    its first text (NaN for a whole answer), and to its end."""
    body = {"prompt": prompt, "temperature": 0, **options}
    start, first = time.perf_counter(), float("nan")
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            text = line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]
            if text and first != first:  # NaN until the first text
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


def run(root: Path, clients: int, chars: int, options: dict[str, Any], extra: list[str]) -> str:
    """One server start from ``root`` (``extra``: more serve options), each request with
    ``options``: its figures as one line."""
    server, url = start_server(["--parallel", str(clients), *extra], root)
    try:
        prompts = passages(19, chars)
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda p: _one(url, p, options), prompts[16:]))  # warm-up
            start = time.perf_counter()
            got = list(pool.map(lambda p: _one(url, p, options), prompts[:16]))
            seconds = time.perf_counter() - start
        ttft = statistics.median(g[0] for g in got)
        latency = statistics.median(g[1] for g in got)
        rate = 16 / seconds
        return f"{rate:.3f} req/s  ttft p50 {ttft * 1e3:.0f} ms  latency p50 {latency:.2f} s"
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs=2, type=Path, help="two source trees: before, after")
    p.add_argument("--clients", type=int, default=8, help="clients, and --parallel")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chars", type=int, default=700, help="prompt characters (700: ~160 tokens)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--serve-args", default="", help="more kvtrim serve options, one string")
    p.add_argument("--plain", action="store_true", help="whole answers, not streamed")
    args = p.parse_args()
    options: dict[str, Any] = {"max_tokens": args.max_tokens, "stream": not args.plain}
    if args.ignore_eos:
        options["ignore_eos"] = True
    for r in range(args.rounds):
        for tree in args.trees:
            line = run(
                tree.resolve(),
                args.clients,
                args.chars,
                options,
                shlex.split(args.serve_args),
            )
            print(f"round {r} [{tree}]: {line}", flush=True)


if __name__ == "__main__":
    main()
