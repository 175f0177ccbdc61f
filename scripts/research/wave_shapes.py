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
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer import PeerConfig, Workload, configurations  # noqa: E402
from engine.bench.peer_servers import KVTRIM, ServerProcess, kvtrim_argv  # noqa: E402

PHASE = 16  # requests a round, as the bench's serve part


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


def workload(cfg: PeerConfig) -> Workload:
    """The bench's serve passages for ``cfg`` (no prefill documents)."""
    from engine.runtime.engine import Engine

    with Engine(cfg.model) as engine:
        return Workload.build(engine, cfg)


def serve_argv(cfg: PeerConfig, log: str, extra: list[str]) -> Callable[[int], list[str]]:
    """The bench's ``kvtrim serve`` command line for ``cfg``'s one client count, run by
    this script's ``child`` (its decodes logged to ``log``), then ``extra``."""
    ((_, launches),) = configurations(cfg, "serve")
    (launch,) = [x for x in launches if x.server == KVTRIM]

    def argv_for(port: int) -> list[str]:
        argv = kvtrim_argv(cfg.model, port, cfg.threads, launch)
        return [sys.executable, __file__, "--child", log, "--",
                *argv[argv.index("serve") + 1 :], *extra]  # fmt: skip

    return argv_for


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
    width = max(d[2] for d in decs)  # the sequences of a full step
    steps = [d[3] for d in decs if d[1] == d[2] == width]
    gaps = sum(b[0] - (a[0] + a[3]) for a, b in itertools.pairwise(decs))
    tokens = sum(d[1] for d in prompts)
    per = 1000 * sum(d[3] for d in prompts) / max(1, tokens)
    print(f"  {rps:.3f} req/s, {len(decs)} decodes, between them {gaps:.2f} s")
    print(f"  prompt rounds {[(d[1], d[2], round(d[3] * 1000)) for d in prompts]}")
    step = 1000 * statistics.median(steps) if steps else float("nan")
    print(f"  {per:.3f} ms a prompt token; a step of {width}: {step:.1f} ms")
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
    from engine.native.embedded import default_model_path

    cfg = PeerConfig(
        model=str(default_model_path()),
        threads=2,
        clients=[args.clients],
        requests=args.rounds * PHASE,  # distinct passages in every round
        lengths=[],
    )
    work = workload(cfg)
    texts = work.streaming if args.stream else work.plain
    sends: list[float] = []
    complete = pc.complete

    def timed(*a: Any, **k: Any) -> Any:
        sends.append(time.perf_counter())
        return complete(*a, **k)

    with tempfile.TemporaryDirectory() as tmp:
        log = f"{tmp}/decodes.log"
        argv_for = serve_argv(cfg, log, shlex.split(args.serve_args))
        for r in range(args.rounds):
            with ServerProcess(argv_for, Path(tmp) / f"serve-{r}.log") as url:
                api = pc.client(url)
                for text in work.warmups:
                    pc.complete(api, text, cfg.gen_tokens)
                api.close()
                sends.clear()
                pc.complete = timed  # what pc.load's clients call
                try:
                    t0 = time.perf_counter()
                    got = pc.load(url, texts[PHASE * r : PHASE * (r + 1)], args.clients,
                                  cfg.gen_tokens, args.stream)  # fmt: skip
                    t1 = time.perf_counter()
                finally:
                    pc.complete = complete
            print(f"round {r}:")
            lines = [line.split() for line in Path(log).read_text().splitlines()]
            report(lines, sorted(sends), (t0, t1), got["requests_per_s"], args.clients)


if __name__ == "__main__":
    main()
