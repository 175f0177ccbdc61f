"""What Python beside a decode costs on a 2-core machine (issue 37): 8-token pooled
steps (8 sequences of 170-token prompts, one shared cache) with the eval callback set
and idle or without it, with and without a thread that runs Python 0.3 ms of every
1.3 ms; medians of 16 steps per round, the four sides alternating.

    .venv/bin/python scripts/research/contention_probe.py --rounds 5

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench.texts import window  # noqa: E402
from engine.native.capture import Capture, Segment  # noqa: E402
from engine.native.context import NativeContext  # noqa: E402
from engine.native.model import Model  # noqa: E402

BUSY_S, IDLE_S = 0.0003, 0.001  # the other thread: Python, then a sleep
# no callback; the callback set and idle; each sequence's visible cells read (the pool's steps)
SIDES = ("none", "callback", "visibility")


def _context(model: Model, prompts: list[list[int]], callback: bool) -> NativeContext:
    capture = Capture(model.info.global_layers) if callback else None
    ctx = NativeContext(model, n_ctx=4096, n_batch=512, n_threads=2, capture=capture,
                        flash_attn=True, n_seq_max=8, kv_unified=True)  # fmt: skip
    for s, toks in enumerate(prompts):
        ctx.decode_batch([(s, t, i, i == len(toks) - 1) for i, t in enumerate(toks)])
    return ctx


def _churn(stop: threading.Event, busy: threading.Event) -> None:
    while not stop.is_set():
        if not busy.is_set():
            time.sleep(0.01)
            continue
        start = time.perf_counter()
        while time.perf_counter() - start < BUSY_S:
            pass
        time.sleep(IDLE_S)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    model = Model()
    prompts = [model.tokenize(window(i * 1500, 1400), add_bos=True)[:170] for i in range(8)]
    ctxs = {name: _context(model, prompts, name != "none") for name in SIDES}
    pos = dict.fromkeys(ctxs, 170)
    stop, busy = threading.Event(), threading.Event()
    threading.Thread(target=_churn, args=(stop, busy), daemon=True).start()
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(args.rounds):
        for contended in (False, True):
            busy.set() if contended else busy.clear()
            for name, ctx in ctxs.items():
                steps = []
                for k in range(16):
                    entries = [(s, 100 + k, pos[name], True) for s in range(8)]
                    pos[name] += 1
                    start = time.perf_counter()
                    segs = [Segment(s, s + 1, 0, True) for s in range(8)]
                    ctx.decode_batch(entries, segs if name == "visibility" else [])
                    steps.append(time.perf_counter() - start)
                times.setdefault((name, contended), []).append(statistics.median(steps))
    stop.set()
    for (name, contended), ts in times.items():
        side = f"{name}, {'a busy thread beside' if contended else 'alone'}"
        print(f"{side:36s} {statistics.median(ts) * 1e3:6.1f} ms a step (rounds: "
              + " ".join(f"{t * 1e3:.1f}" for t in ts) + ")")  # fmt: skip


if __name__ == "__main__":
    main()
