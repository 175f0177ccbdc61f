"""How ``kvtrim serve`` cuts a wave of prompts into rounds, under the benchmark's own
serve load (``kvtrim bench --peer``'s ~160-token passages, 32 tokens out, the OpenAI
SDK's client from N threads): each pooled ``llama_decode`` (tokens, sequences,
seconds) and when each request was sent and its prompt queued in the pool.

    .venv/bin/python scripts/research/wave_shapes.py --clients 8 --rounds 3
    .venv/bin/python scripts/research/wave_shapes.py --clients 8 --stream \\
        --serve-args "--kv-layout streams"

Per phase: requests/s, the prompt rounds as ``(tokens, sequences, ms)`` and what a
prompt token cost, the median step of N answer tokens, the seconds between decodes,
and for each wave the milliseconds (from its first request) at which the requests
were sent and their prompts reached the pool. The server runs in a child process of
this script that wraps ``NativeContext.decode_batch`` and ``Scheduler.submit`` to log
(both sides read the same monotonic clock). Run it alone on the machine (llama.cpp's
threads spin while they wait). History: docs/benchmarks/history.md, issue 37.
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer_servers import free_port  # noqa: E402

GEN = 32
REQUESTS = 16


def child(log: str, argv: list[str]) -> int:
    """``kvtrim serve argv`` with each pooled decode and each queued prompt logged."""
    from engine.cli.main import main
    from engine.native.context import NativeContext
    from engine.pool.scheduler import Scheduler

    out = open(log, "a", buffering=1)  # noqa: SIM115 - for the process's life
    decode, submit = NativeContext.decode_batch, Scheduler.submit

    def logged_decode(self: Any, entries: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        got = decode(self, entries, *args, **kwargs)
        seqs = len({e[0] for e in entries})
        out.write(f"{t0:.6f} dec {len(entries)} {seqs} {time.perf_counter() - t0:.6f}\n")
        return got

    def logged_submit(self: Any, seq: int, cancel: Any, tokens: Any, *args: Any) -> Any:
        if len(tokens) > 1:
            out.write(f"{time.perf_counter():.6f} prompt {len(tokens)} {seq} 0\n")
        return submit(self, seq, cancel, tokens, *args)

    NativeContext.decode_batch = logged_decode  # type: ignore[method-assign]
    Scheduler.submit = logged_submit  # type: ignore[method-assign]
    return int(main(["serve", *argv]) or 0)


def passages(n: int) -> list[str]:
    """The bench's serve passages (``peer.Workload``'s offsets), ``n`` of them."""
    from engine.bench.tasks import real_text
    from engine.runtime.engine import Engine

    with Engine() as engine:
        return [real_text(engine, 160, 3_000 + 5_000 * i) for i in range(n)]


def start(log: str, clients: int, extra: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    from engine.native.embedded import default_model_path

    port = free_port()
    argv = ["--model", str(default_model_path()), "--port", str(port), "--threads", "2",
            "--parallel", str(clients), "--policy", "snapkv", "--budget", "512",
            "--max-queue", "64", "--kv-cells", str(max(2048, 256 * clients)), *extra]  # fmt: skip
    cmd = [sys.executable, __file__, "--child", log, "--", *argv]
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    return server, url


def report(
    lines: list[list[str]], sends: list[float], span: tuple[float, float], rps: float, clients: int
) -> None:
    """One phase's decodes and waves (``clients`` requests each), from the log lines
    in ``span``."""
    t0, t1 = span
    decs = [(float(w[0]), int(w[2]), int(w[3]), float(w[4])) for w in lines if w[1] == "dec"]
    decs = [d for d in decs if t0 <= d[0] <= t1]
    queued = sorted(float(w[0]) for w in lines if w[1] == "prompt" and t0 <= float(w[0]) <= t1)
    prompts = [d for d in decs if d[1] > d[2]]
    steps = [d[3] for d in decs if d[1] == d[2] == max(x[2] for x in decs)]
    gaps = sum(b[0] - (a[0] + a[3]) for a, b in itertools.pairwise(decs))
    tokens = sum(d[1] for d in prompts)
    per = 1000 * sum(d[3] for d in prompts) / max(1, tokens)
    print(f"  {rps:.3f} req/s, {len(decs)} decodes, between them {gaps:.2f} s")
    print(f"  prompt rounds {[(d[1], d[2], round(d[3] * 1000)) for d in prompts]}")
    step = 1000 * statistics.median(steps) if steps else float("nan")
    print(f"  {per:.3f} ms a prompt token; a step of {max(d[2] for d in decs)}: {step:.1f} ms")
    for w0 in sends[::clients]:  # the first request of each wave
        sent = [round((t - w0) * 1000, 1) for t in sends if w0 <= t < w0 + 0.5]
        got = [round((t - w0) * 1000, 1) for t in queued if w0 <= t < w0 + 0.5]
        print(f"  wave: sent at {sent} ms, queued at {got} ms")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], sys.argv[4:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--stream", action="store_true", help="streamed answers, not whole")
    p.add_argument("--serve-args", default="", help="more kvtrim serve options, one string")
    args = p.parse_args()
    texts = passages(3 + REQUESTS * args.rounds)
    sends: list[float] = []
    complete = pc.complete

    def timed(*a: Any, **k: Any) -> Any:
        sends.append(time.perf_counter())
        return complete(*a, **k)

    with tempfile.TemporaryDirectory() as tmp:
        log = f"{tmp}/decodes.log"
        for r in range(args.rounds):
            server, url = start(log, args.clients, shlex.split(args.serve_args))
            try:
                api = pc.client(url)
                for text in texts[:3]:
                    pc.complete(api, text, GEN)
                phase = texts[3 + REQUESTS * r : 3 + REQUESTS * (r + 1)]
                sends.clear()
                pc.complete = timed  # what pc.load's clients call
                t0 = time.perf_counter()
                got = pc.load(url, phase, args.clients, GEN, args.stream)
                t1 = time.perf_counter()
            finally:
                pc.complete = complete
                server.terminate()
                server.wait()
            print(f"round {r}:")
            lines = [line.split() for line in Path(log).read_text().splitlines()]
            report(lines, sorted(sends), (t0, t1), got["requests_per_s"], args.clients)


if __name__ == "__main__":
    main()
