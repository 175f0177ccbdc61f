#!/usr/bin/env python3
"""Why does position compaction break long answers? (issue 27, item 2)

A release-notes haystack (dense with version numbers and bug ids) with one planted
sentence ("Site note: the vault combination is 58316.") at 40% of its length is read
with SnapKV at a fixed budget, once per position mode, and the right answer is
teacher-forced after the answer prefix. Modes: ``compact``, ``original`` and
``gapN`` (``bounded`` with each hole shortened to at most N positions). For every
answer token it records the log probability margin (nats) of the right token over the
best other one: positive means greedy decoding writes it. The full cache (where the
document fits the trained context) is the reference.

    .venv/bin/python scripts/research/positions_probe.py --lengths 8192,16384,30000

Prints one JSON line per run. Run it alone (llama.cpp's threads spin).
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np

from engine import Engine, Session
from engine.bench.tasks import log_softmax
from engine.session.prompts import ask_prompt
from engine.session.sampling import Sampling

NEEDLE = "Site note: the vault combination is 58316."
QUESTION = "What is the vault combination?"
PREFIX = "The vault combination is"
ANSWER = " 58316."
SOURCES = [
    Path("/usr/share/doc/python3.11/NEWS.gz"),
    Path("/usr/share/doc/libc6/NEWS.gz"),
]


def notes() -> str:
    for path in SOURCES:
        if path.exists():
            return gzip.decompress(path.read_bytes()).decode("utf-8", "replace")
    import idlelib

    return (Path(idlelib.__file__).parent / "NEWS.txt").read_text()


def document(engine: Engine, n_tokens: int, depth: float = 0.4) -> str:
    text = notes()
    while len(text) < n_tokens * 6:
        text += "\n\n" + text
    ids = engine.model.tokenize(text[: n_tokens * 6])[:n_tokens]
    body = engine.model.detokenize(ids)
    cut = body.rfind("\n", 0, int(len(body) * depth)) + 1
    return body[:cut] + NEEDLE + "\n" + body[cut:]


def margins(logits: np.ndarray, answer: list[int]) -> list[float]:
    """Log-probability margin of each right token over the best other one."""
    out = []
    for lp, tok in zip(log_softmax(logits.astype(np.float64)), answer, strict=True):
        out.append(float(lp[tok] - np.delete(lp, tok).max()))
    return out


def probe(engine: Engine, doc: str, policy: str, budget: int, positions: str) -> dict:
    model = engine.model
    prompt = ask_prompt(model, doc, QUESTION, PREFIX)
    head = model.tokenize(prompt.prefix, add_bos=prompt.add_bos, markup=prompt.prefix_markup)
    head += model.tokenize(prompt.document)
    tail = model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
    answer = model.tokenize(ANSWER)
    start = time.perf_counter()
    gap = {}
    if positions.startswith("gap"):  # bounded mode with this gap
        gap, positions = {"position_gap": int(positions[3:])}, "bounded"
    with engine.session(policy, budget, positions=positions, **gap) as s:
        for _ in s.run_tokens(head, tail, max_tokens=0):
            pass
        first, first_id = s.reader.logits.copy(), s.cache.next_id
        rows = np.concatenate(list(s.teacher_force(answer)))
        held_lpos_max = int(s.cache.lpos.max())
        # back to the state after the prefix: what greedy decoding writes there
        s.cache.drop_tail(first_id)
        s.reader.logits = first
        greedy = Session.collect(s.generate(max_tokens=16, sampling=Sampling())).text
    logits = np.vstack([first[None, :], rows[:-1]])
    m = margins(logits, answer)
    pieces = [model.detokenize([t]) for t in answer]
    return {
        "policy": policy,
        "budget": budget,
        "positions": positions,
        **gap,
        "prompt_tokens": len(head) + len(tail),
        "max_position": held_lpos_max,
        "answer_pieces": pieces,
        "margins": [round(x, 3) for x in m],
        "first_digit_margin": round(m[next(i for i, p in enumerate(pieces) if p.strip())], 3),
        "min_margin": round(min(m), 3),
        "greedy": greedy,
        "seconds": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="8192,16384,30000")
    p.add_argument("--budget", type=int, default=1024)
    p.add_argument("--modes", default="compact,original", help="also auto, bounded, gapN")
    p.add_argument(
        "--full",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the full cache as the reference where the document fits",
    )
    args = p.parse_args()
    with Engine() as engine:
        n_train = engine.model.info.n_ctx_train
        for n in (int(x) for x in args.lengths.split(",")):
            doc = document(engine, n)
            runs = [("snapkv", args.budget, m) for m in args.modes.split(",")]
            if args.full and n + 256 < n_train:
                runs.insert(0, ("full", n + 256, "original"))
            for policy, budget, mode in runs:
                r = probe(engine, doc, policy, budget, mode)
                print(json.dumps({"length": n, **r}), flush=True)


if __name__ == "__main__":
    main()
