"""Passkey retrieval per policy at one budget, with memory and speed figures.

    python scripts/passkey_eval.py --budget 1024 --junk 340 --depths 5

llama.cpp's passkey prompt (filler text with the key at several depths); every
policy reads the same documents with the same budget. Prints a Markdown table.
Issue 3's ``kvtrim bench`` supersedes this with more tasks and plots.
"""

from __future__ import annotations

import argparse
import random
import time

from engine import Engine, Prompt, Session
from engine.bench.tasks import PASSKEY_PREFIX as PREFIX
from engine.bench.tasks import PASSKEY_SUFFIX as SUFFIX
from engine.bench.tasks import passkey_haystack


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--junk", type=int, default=340, help="filler repeats (24 tokens each)")
    ap.add_argument("--depths", type=int, default=5)
    ap.add_argument("--policies", default="streaming,h2o,tova,snapkv")
    args = ap.parse_args()
    depths = [(i + 0.5) / args.depths for i in range(args.depths)]
    eng = Engine()
    print(
        "| policy | hits | prompt tokens | KV peak / full | prefill tok/s | decode tok/s "
        "| capture+score share of prefill |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.policies.split(","):
        hits, rows = 0, []
        for depth in depths:
            key = random.Random(round(depth * 1000)).randint(10000, 99999)
            prompt = Prompt(PREFIX, passkey_haystack(args.junk, depth, key), SUFFIX, (), True)
            # the full cache is the reference: a budget that holds the whole prompt
            budget = args.budget if name != "full" else args.junk * 25 + 256
            with eng.session(name, budget) as s:
                t = time.perf_counter()
                r = Session.collect(s.run(prompt, max_tokens=8))
                rows.append((r.stats, time.perf_counter() - t))
            hits += str(key) in r.text
        st = [s for s, _ in rows]
        n = len(st)
        ratio = sum(s.kv_bytes / s.kv_bytes_full for s in st) / n
        pf = sum(s.prefill_tokens_per_s for s in st) / n
        dec = sum(s.decode_tokens_per_s for s in st) / n
        share = sum((s.capture_s + s.score_s) / s.prefill_s for s in st) / n
        print(
            f"| {name} | {hits}/{n} | {st[0].prompt_tokens} | {ratio:.3f} | {pf:.0f} | "
            f"{dec:.1f} | {share:.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
