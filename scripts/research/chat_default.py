#!/usr/bin/env python3
"""Which embedded model should chat by default? (issue 34, item 1)

A chat user asks without an answer prefix. For each model: the fidelity run's
documents (fidelity_docs.py: five haystack kinds, planted facts with same-shape
distractors) of ``--length`` tokens, the first question asked as a user would (no
answer prefix) with the app's and ``kvtrim chat``'s defaults (SnapKV, budget 1,024,
recall on), then one follow-up from the same cache. Scored as the fidelity run
scores (the value whole, no distractor's), with Wilson intervals; the answers' length
in words says whether the model answers or rambles. One JSON line per item.

    .venv/bin/python scripts/research/chat_default.py --docs 6 --out chat-default.jsonl

Run it alone (llama.cpp's threads spin).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine import Engine  # noqa: E402
from engine.bench import fidelity_docs as docs  # noqa: E402
from engine.bench.intervals import wilson  # noqa: E402
from engine.runtime.spec import RequestSpec  # noqa: E402


def one_document(engine: Engine, doc: docs.Document, max_tokens: int) -> list[dict]:
    """The first question and one follow-up about ``doc``, no answer prefix."""
    spec = RequestSpec(max_tokens=max_tokens)
    out = []
    with spec.open(engine) as s:
        first, second = doc.asked[0], doc.asked[1]
        done = s.collect(s.ask(doc.text, first.question, max_tokens=max_tokens))
        out.append(("first", first, done))
        done = s.collect(s.follow_up(second.question, max_tokens=max_tokens))
        out.append(("follow", second, done))
    return [
        {"path": path, "kind": fact.kind, "value": fact.value, "answer": d.text.strip(),
         "words": len(d.text.split()), "reason": d.reason, **docs.judge(fact, d.text)}
        for path, fact, d in out
    ]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--docs", type=int, default=6, help="per haystack kind")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("chat-default.jsonl"))
    args = parser.parse_args()
    rows = []
    with args.out.open("w") as f:
        for name in args.models.split(","):
            with Engine(name) as engine:
                for index in range(args.docs):
                    for haystack in docs.HAYSTACKS:
                        doc = docs.make_document(engine.model, haystack, args.length, index)
                        for row in one_document(engine, doc, args.max_tokens):
                            row |= {"model": name, "haystack": haystack, "doc": index}
                            f.write(json.dumps(row) + "\n")
                            f.flush()
                            rows.append(row)
    for name in args.models.split(","):
        for path in ("first", "follow"):
            mine = [r for r in rows if r["model"] == name and r["path"] == path]
            hits = sum(r["right"] for r in mine)
            low, high = wilson(hits, len(mine))
            words = sorted(r["words"] for r in mine)[len(mine) // 2] if mine else 0
            print(f"{name} {path}: {hits}/{len(mine)} right ({100 * low:.0f}-{100 * high:.0f}%), "
                  f"median {words} words")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
