"""Requests/s and tokens/s of ``kvtrim serve`` for concurrent short requests.

    .venv/bin/python scripts/load_test.py --concurrency 8 --requests 32

Starts the server in-process on a free loopback port with the default model
(or use --url for a running one), sends --requests completions with at most
--concurrency in flight, and prints one Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from engine import Engine
from engine.bench.texts import window
from engine.serve.api import ServerConfig, create_app
from engine.serve.background import BackgroundServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--prompt-chars", type=int, default=600, help="about 150 tokens")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--policy", default="snapkv")
    ap.add_argument("--budget", type=int, default=256)
    args = ap.parse_args()
    if args.url:
        measure(args, args.url)
        return
    config = ServerConfig(policy=args.policy, budget_tokens=args.budget, parallel=1)
    app = create_app(Engine(), config)
    with BackgroundServer(app) as url:
        measure(args, url)


def measure(args: argparse.Namespace, url: str) -> None:
    client = httpx.Client(base_url=url, timeout=600)
    prompts = [window(i * 5000, args.prompt_chars) for i in range(args.requests)]

    def one(prompt: str) -> tuple[float, dict]:
        start = time.perf_counter()
        body = {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0}
        r = client.post("/v1/completions", json=body)
        r.raise_for_status()
        return time.perf_counter() - start, r.json()

    one(prompts[0])  # warm up: the first request allocates the session
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - start
    latencies = sorted(t for t, _ in results)
    prompt_tokens = sum(r["usage"]["prompt_tokens"] for _, r in results)
    out_tokens = sum(r["usage"]["completion_tokens"] for _, r in results)
    print(
        "| requests | concurrency | wall (s) | requests/s | prompt tok/s | generated tok/s "
        "| latency p50 / max (s) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {len(results)} | {args.concurrency} | {wall:.1f} | {len(results) / wall:.2f} | "
        f"{prompt_tokens / wall:.0f} | {out_tokens / wall:.1f} | "
        f"{statistics.median(latencies):.1f} / {latencies[-1]:.1f} |"
    )


if __name__ == "__main__":
    main()
