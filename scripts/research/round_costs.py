"""What a pooled round costs in llama.cpp alone, by context and batch shape,
alternating in one process (no server, no scheduler):

- ``wave``: 8 prompts of 169 tokens read into an empty context: the pool's rounds
  of at most 512 tokens, one decode of n_batch 2,048 over ubatches of 512 (the
  pool since issue 37's rounds), and llama-server's (a stream per sequence, one
  decode of n_batch 2,048 over ubatches of 512);
- ``wave, one prompt a round``: the same 8 prompts, each read in a round of its
  own beside one answer token of every sequence already answering (what a wave
  becomes once its answers end at different times, issue 37);
- ``steps``: steps of 8 answer tokens, 8 sequences of ~170 cells, with the eval
  callback set and each step's visibility read (a pooled step's cell map), set
  and idle, none, and a stream per sequence with none.

    .venv/bin/python scripts/research/round_costs.py --rounds 7

Milliseconds, median and min over the rounds after the first. Run it alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench.texts import window  # noqa: E402
from engine.native.capture import Segment  # noqa: E402
from engine.native.context import NativeContext  # noqa: E402
from engine.native.model import Model  # noqa: E402
from engine.policies import needs_of  # noqa: E402

SEQS, PROMPT = 8, 169  # sequences, prompt tokens each
ONE = "wave: shared, one decode"
FRAGMENTED = "wave: shared, one prompt a round"


def _context(model: Model, unified: bool, n_batch: int, capture: object = None) -> NativeContext:
    return NativeContext(model, n_ctx=2048, n_batch=n_batch, n_ubatch=512, n_threads=2,
                         capture=capture, n_seq_max=SEQS, kv_unified=unified)  # type: ignore[arg-type]  # fmt: skip


def _wave(ctx: NativeContext, prompts: list[list[int]], cut: int) -> float:
    """Seconds to read every prompt into an empty context, in decodes of ``cut``."""
    for s in range(SEQS):
        ctx.seq_rm(0, -1, s)
    entries = [(s, t, i, i == PROMPT - 1) for s in range(SEQS) for i, t in enumerate(prompts[s])]
    start = time.perf_counter()
    for a in range(0, len(entries), cut):
        ctx.decode_batch(entries[a : a + cut])
    return time.perf_counter() - start


def _one_a_round(ctx: NativeContext, prompts: list[list[int]]) -> float:
    """Seconds to read the prompts one a round, each round also decoding one answer
    token of each sequence whose prompt was read before."""
    for s in range(SEQS):
        ctx.seq_rm(0, -1, s)
    pos = [0] * SEQS
    start = time.perf_counter()
    for k in range(SEQS):
        answers = [(s, 100, pos[s], True) for s in range(k)]
        ctx.decode_batch(answers + [(k, t, i, i == PROMPT - 1) for i, t in enumerate(prompts[k])])
        pos = [p + 1 if s < k else p for s, p in enumerate(pos)]
        pos[k] = PROMPT
    return time.perf_counter() - start


def _steps(ctx: NativeContext, armed: bool, n: int = 8) -> float:
    """Seconds a step of one answer token per sequence (and its logits read), after
    the prompts; ``armed``: each step reads the cells its rows see."""
    for s in range(SEQS):
        ctx.seq_rm(PROMPT, -1, s)
    start = time.perf_counter()
    for k in range(n):
        entries = [(s, 100, PROMPT + k, True) for s in range(SEQS)]
        segments = [Segment(s, s + 1, 0, True) for s in range(SEQS)] if armed else []
        ctx.decode_batch(entries, segments)
        for s in range(SEQS):
            ctx.logits_at(s)
    return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    model = Model()
    capture = needs_of().capture(model.info)
    texts = [window(i * 1500 + 11, 1400) for i in range(40)]
    prompts = [model.tokenize(t, add_bos=True)[:PROMPT] for t in texts]
    waves = {
        "wave: shared, decodes of 512": (_context(model, True, 512), 512),
        ONE: (_context(model, True, 2048), 2048),
        "wave: streams, one decode (llama-server)": (_context(model, False, 2048), 2048),
    }
    steps = {
        "steps: shared, callback, visibility read": (_context(model, True, 2048, capture), True),
        "steps: shared, callback idle": (_context(model, True, 2048, capture), False),
        "steps: shared, no callback": (_context(model, True, 2048), False),
        "steps: streams, no callback": (_context(model, False, 2048), False),
    }
    times: dict[str, list[float]] = {name: [] for name in [*waves, FRAGMENTED, *steps]}
    for r in range(args.rounds):
        some = [prompts[(3 * r + s) % len(prompts)] for s in range(SEQS)]
        for name, (ctx, cut) in waves.items():
            times[name].append(_wave(ctx, some, cut))
        times[FRAGMENTED].append(_one_a_round(waves[ONE][0], some))
        for name, (ctx, armed) in steps.items():
            _wave(ctx, some, 2048)
            times[name].append(_steps(ctx, armed))
    for name, ts in times.items():
        kept = ts[1:] or ts
        mid = statistics.median(kept)
        per = f" ({mid / (SEQS * PROMPT) * 1e3:.3f} ms a token)" if name.startswith("wave") else ""
        print(f"{name:44s} median {mid * 1e3:7.1f} ms, min {min(kept) * 1e3:7.1f}{per}")


if __name__ == "__main__":
    main()
