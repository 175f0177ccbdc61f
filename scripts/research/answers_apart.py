"""Answer tokens beside prompt chunks in one shared KV pool: one ``llama_decode`` a
round (mixed) against the answers first and the chunk after (apart, ``plan.decodes``),
alternating in one process, no server and no scheduler (issue 37).

- ``--load held``: 3 sequences hold ``--held`` cells each (documents read before),
  then 4 rounds of their 3 answer tokens beside a 161-token chunk of a fourth;
- ``--load wave``: 8 prompts of 161 tokens, each read in a round beside one answer
  token of every sequence read before it (a wave whose answers ended at different
  times).

    .venv/bin/python scripts/research/answers_apart.py --load held --held 1500
    .venv/bin/python scripts/research/answers_apart.py --load wave --model smollm2-135m

Milliseconds, median over the runs after the first. Run it alone on the machine.
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
from engine.native.context import NativeContext  # noqa: E402
from engine.native.model import Model  # noqa: E402

CHUNK = 161  # prompt tokens a round
Entry = tuple[int, int, int, bool]  # (sequence, token, position, logits)


def _held(
    doc: list[int], held: int
) -> tuple[list[list[Entry]], list[tuple[list[Entry], list[Entry]]]]:
    """Decodes that fill 3 sequences with ``held`` cells, then 4 rounds of
    (answers, chunk)."""
    fill = []
    for s in range(3):
        toks = doc[s * 100 : s * 100 + held]
        fill += [
            [(s, t, a + i, False) for i, t in enumerate(toks[a : a + 512])]
            for a in range(0, held, 512)
        ]
    rounds = []
    for r in range(4):
        answers = [(s, 100, held + r, True) for s in range(3)]
        part = doc[5000 + r * CHUNK : 5000 + (r + 1) * CHUNK]
        rounds.append(
            (answers, [(3, t, r * CHUNK + i, i == CHUNK - 1) for i, t in enumerate(part)])
        )
    return fill, rounds


def _wave(prompts: list[list[int]]) -> list[tuple[list[Entry], list[Entry]]]:
    """Rounds of one prompt each beside an answer token of each sequence before it."""
    rounds, pos = [], [0] * len(prompts)
    for k, p in enumerate(prompts):
        answers = [(s, 100, pos[s], True) for s in range(k)]
        rounds.append((answers, [(k, t, i, i == len(p) - 1) for i, t in enumerate(p)]))
        pos = [x + 1 if s < k else x for s, x in enumerate(pos)]
        pos[k] = len(p)
    return rounds


def _run(ctx: NativeContext, rounds: list[tuple[list[Entry], list[Entry]]], apart: bool) -> None:
    for answers, chunk in rounds:
        if apart and answers:
            ctx.decode_batch(answers)
            ctx.decode_batch(chunk)
        else:
            ctx.decode_batch(chunk[:-1] + answers + chunk[-1:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--load", choices=("held", "wave"), default="held")
    p.add_argument("--held", type=int, default=1500, help="cells each answering sequence holds")
    p.add_argument(
        "--model", default=None, help="an embedded model's name or a GGUF (default: the default)"
    )
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    model = Model(args.model)
    seqs = 4 if args.load == "held" else 8
    ctx = NativeContext(model, n_ctx=8192, n_batch=2048, n_ubatch=512, n_threads=2,
                        n_seq_max=seqs, kv_unified=True, capture=None)  # fmt: skip
    doc = model.tokenize(window(11, 60000), add_bos=True)
    times: dict[str, list[float]] = {"mixed": [], "apart": []}
    for r in range(args.runs):
        for name in ("mixed", "apart") if r % 2 else ("apart", "mixed"):
            for s in range(seqs):
                ctx.seq_rm(0, -1, s)
            if args.load == "held":
                fill, rounds = _held(doc, args.held)
                for entries in fill:
                    ctx.decode_batch(entries)
            else:
                rounds = _wave([doc[(3 * r + s) * CHUNK :][:CHUNK] for s in range(seqs)])
            start = time.perf_counter()
            _run(ctx, rounds, name == "apart")
            if r:  # the first run warms up
                times[name].append(time.perf_counter() - start)
    what = f"held {args.held}" if args.load == "held" else "wave"
    mixed = statistics.median(times["mixed"])
    for name, ts in times.items():
        mid = statistics.median(ts)
        print(f"{args.model or 'default model'}, {what}: {name:5s} median {mid * 1e3:7.1f} ms "
              f"({mid / mixed:.3f} of mixed, {len(ts)} runs)")  # fmt: skip


if __name__ == "__main__":
    main()
