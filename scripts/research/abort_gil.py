"""What a Python abort callback costs a decode while another Python thread runs
(issue 37): one 256-token prompt read into a context whose abort is asked of
Python (a ctypes callback, as kvtrim's was) or of ggml in C (``_ggml.AbortFlag``),
alone and beside a thread busy in Python, alternating in one process. The reads run
on a worker thread, as the app's and the server's do (on the main thread kvtrim asks
Python for long decodes, so that Ctrl+C can stop them).

    .venv/bin/python scripts/research/abort_gil.py --rounds 5

Milliseconds, median over the rounds after the first. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench.texts import window  # noqa: E402
from engine.native.context import NativeContext  # noqa: E402
from engine.native.model import Model  # noqa: E402

TOKENS = 256


class Busy:
    """A daemon thread that spins in Python while ``on`` is set."""

    def __init__(self) -> None:
        self.on = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        x = 0
        while True:
            if not self.on.wait(1.0):
                continue
            for i in range(1000):
                x += i


def _read(ctx: NativeContext, tokens: list[int]) -> float:
    ctx.seq_rm(0, -1)
    entries = [(0, t, i, i == len(tokens) - 1) for i, t in enumerate(tokens)]
    start = time.perf_counter()
    ctx.decode_batch(entries)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    model = Model()
    tokens = model.tokenize(window(11, 4000), add_bos=True)[:TOKENS]

    def context() -> NativeContext:
        return NativeContext(model, n_ctx=1024, n_batch=512, n_threads=2, capture=None)

    contexts = {"Python callback": context(), "C flag": context()}
    py = contexts["Python callback"]
    callback = llama_cpp.ggml_abort_callback(lambda _data: py.cancel_event.is_set())
    llama_cpp.llama_set_abort_callback(py._ctx.ctx, callback, None)
    busy = Busy()
    worker = ThreadPoolExecutor(1)
    times: dict[tuple[bool, str], list[float]] = {}
    for _ in range(args.rounds):
        for beside in (False, True):
            (busy.on.set if beside else busy.on.clear)()
            for name, ctx in contexts.items():
                took = worker.submit(_read, ctx, tokens).result()
                times.setdefault((beside, name), []).append(took)
    busy.on.clear()
    for (beside, name), ts in times.items():
        kept = ts[1:] or ts
        where = "beside a busy Python thread" if beside else "alone"
        print(f"{name:16s} {where:28s} median {statistics.median(kept) * 1e3:7.1f} ms, "
              f"min {min(kept) * 1e3:7.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
