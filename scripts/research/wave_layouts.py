"""What a wave of prompts costs in the pool's two KV layouts, alternating in one
process: 8 sequences hold 170-token prompts and each decodes one answer token while
7 new 170-token prompts are read beside them (the load of ``kvtrim bench --peer``
with 8 clients), in

- one KV pool (``--kv-layout shared``): one decode of all, or decodes of at most 512;
- one KV stream per sequence (``streams``): one decode of all (llama.cpp splits it),
  or the answer tokens together and each prompt alone (as the pool's scheduler does).

    .venv/bin/python scripts/research/wave_layouts.py --rounds 6

Seconds per wave, median and min over the rounds after the first. Run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench.texts import window  # noqa: E402
from engine.native.context import NativeContext  # noqa: E402
from engine.native.model import Model  # noqa: E402

RUNNING, ARRIVING, PROMPT = 8, 7, 170  # sequences, new prompts, tokens each


def _context(model: Model, n_batch: int, unified: bool) -> NativeContext:
    return NativeContext(model, n_ctx=4096, n_batch=n_batch, n_threads=2, capture=None,
                         flash_attn=True, n_seq_max=16, kv_unified=unified)  # fmt: skip


def _wave(ctx: NativeContext, prompts: list[list[int]], calls: str) -> float:
    """Seconds to decode one answer token of each running sequence and the arriving
    prompts, in ``calls``: "one", "512" (decodes of at most 512) or "apart"."""
    for s in range(RUNNING + ARRIVING):
        ctx.seq_rm(0, -1, s)
    for s in range(RUNNING):
        ctx.decode_batch([(s, t, i, i == PROMPT - 1) for i, t in enumerate(prompts[s])])
    answers = [(s, 100, PROMPT, True) for s in range(RUNNING)]
    reads = [[(s, t, i, i == PROMPT - 1) for i, t in enumerate(prompts[s])]
             for s in range(RUNNING, RUNNING + ARRIVING)]  # fmt: skip
    every = answers + [e for r in reads for e in r]
    groups = {"one": [every], "512": [every[a : a + 512] for a in range(0, len(every), 512)],
              "apart": [answers, *reads]}[calls]  # fmt: skip
    start = time.perf_counter()
    for group in groups:
        ctx.decode_batch(group)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args()
    model = Model()
    texts = [window(i * 1500, 1400) for i in range(RUNNING + ARRIVING)]
    prompts = [model.tokenize(t, add_bos=True)[:PROMPT] for t in texts]
    sides: dict[str, Callable[[], float]] = {}
    for name, n_batch, unified, calls in (
        ("shared, one decode", 2048, True, "one"),
        ("shared, decodes of 512", 512, True, "512"),
        ("streams, one decode", 2048, False, "one"),
        ("streams, prompts apart", 512, False, "apart"),
    ):
        ctx = _context(model, n_batch, unified)
        sides[name] = lambda ctx=ctx, calls=calls: _wave(ctx, prompts, calls)
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name, run in sides.items():
            times[name].append(run())
    n = RUNNING + ARRIVING * PROMPT
    for name, ts in times.items():
        kept = ts[1:] or ts
        mid = statistics.median(kept)
        print(f"{name:24s} {n} tokens: median {mid:.3f} s, min {min(kept):.3f} s "
              f"({mid / n * 1000:.2f} ms a token)")  # fmt: skip


if __name__ == "__main__":
    main()
