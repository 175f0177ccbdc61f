"""Does the pool answer as well with flash attention on (attention computed from the
fused node's inputs) as with it off? Documents longer than their share (they evict),
read three at a time in one pool under SnapKV: prose with a pass key at a random depth,
or (``--fidelity``) the fidelity benchmark's documents of every haystack, three planted
facts with two same-shape distractors each, the first question judged as the benchmark
judges it. Wilson intervals and the paired difference (Newcombe).

    .venv/bin/python scripts/research/pool_flash.py --items 60 --words 1500
    .venv/bin/python scripts/research/pool_flash.py --fidelity --items 30 --length 2048

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers.docs_for_tests import prose  # noqa: E402
from helpers.together import run_together  # noqa: E402

from engine import Engine  # noqa: E402
from engine.bench import fidelity_docs as fd  # noqa: E402
from engine.bench.intervals import paired_difference, wilson  # noqa: E402
from engine.policies import make_policy  # noqa: E402
from engine.pool.kvpool import KVPool  # noqa: E402
from engine.session.core import SessionConfig  # noqa: E402
from engine.session.prompts import ask_prompt  # noqa: E402

Q, PREFIX = "What is the pass key? Give the number.", "The pass key is"


Item = tuple[str, str, str, Callable[[str], bool]]  # text, question, prefix, judge


def items(n: int, words: int, seed: int) -> list[Item]:
    rng = random.Random(seed)
    out: list[Item] = []
    for i in range(n):
        key, depth = rng.randrange(10000, 99999), rng.random()
        before = max(1, int(words * depth) // 10)
        after = max(1, words // 10 - before)
        text = f"{prose(before, seed=3 * i)} The pass key is {key}. Remember it. "
        text += prose(after, seed=3 * i + 1)
        out.append((text, Q, PREFIX, lambda answer, key=key: str(key) in answer))
    return out


def fidelity_items(engine: Engine, n: int, length: int) -> list[Item]:
    out: list[Item] = []
    for i in range(n):
        doc = fd.make_document(engine.model, fd.HAYSTACKS[i % len(fd.HAYSTACKS)], length,
                               i // len(fd.HAYSTACKS))  # fmt: skip
        fact = doc.asked[0]
        judged = functools.partial(lambda f, answer: fd.judge(f, answer)["found"], fact)
        out.append((doc.text, fact.question, fact.prefix, judged))
    return out


def run(engine: Engine, docs: list[Item], flash: str, budget: int) -> list[bool]:
    found = [False] * len(docs)
    for at in range(0, len(docs), 3):
        group = list(range(at, min(at + 3, len(docs))))
        pool = KVPool(engine.model, cells=3 * (budget + 512), max_seqs=3, n_threads=2,
                      flash_attn=flash)  # fmt: skip

        def job(i: int, pool: KVPool = pool) -> None:
            text, question, prefix, judged = docs[i]
            p = ask_prompt(engine.model, text, question, prefix)
            n = len(engine.model.tokenize(p.prefix + p.document + p.suffix)) + 16
            with pool.open(make_policy("snapkv"), SessionConfig(budget), n) as s:
                answer = s.collect(s.ask(text, question, answer_prefix=prefix, max_tokens=16))
                found[i] = judged(answer.text)

        run_together(job, group, pool)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--items", type=int, default=30)
    p.add_argument("--words", type=int, default=500, help="sentences x 10, roughly")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--fidelity", action="store_true", help="the fidelity benchmark's items")
    p.add_argument("--model", default=None, help="a model name or path (default: the default)")
    p.add_argument("--length", type=int, default=2048, help="with --fidelity: tokens")
    args = p.parse_args()
    with Engine(args.model) as engine:
        if args.fidelity:
            docs = fidelity_items(engine, args.items, args.length)
        else:
            docs = items(args.items, args.words, args.seed)
        off = run(engine, docs, "off", args.budget)
        on = run(engine, docs, "on", args.budget)
    n = len(docs)
    for name, got in (("off", off), ("on", on)):
        lo, hi = wilson(sum(got), n)
        print(f"flash {name}: {sum(got)}/{n} ({100 * lo:.0f}-{100 * hi:.0f}%)")
    d, lo, hi = paired_difference(on, off)
    print(f"on - off: {100 * d:+.0f} points ({100 * lo:+.0f}..{100 * hi:+.0f}); "
          f"same verdict {sum(a == b for a, b in zip(on, off, strict=True))}/{n}")  # fmt: skip


if __name__ == "__main__":
    main()
