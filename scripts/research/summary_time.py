"""The app's summary path timed (``chat.turn_events`` with no question: what Summarize
does), then a follow-up, in the checkout given (to compare two checkouts, run it in
each, one after the other, alone on the machine):

    .venv/bin/python scripts/research/summary_time.py . resources/samples/passkey.txt

Prints one JSON line: the summary's seconds and text, the follow-up's seconds and answer.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

QUESTION, PREFIX = "What is the pass key? Give the number.", "The pass key is"


def main() -> None:
    tree, doc = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    sys.path.insert(0, str(tree))
    from engine import Engine, Session
    from engine.runtime.chat import turn_events

    engine = Engine()
    session = engine.session("snapkv", 1024)
    text = doc.read_text()
    start = time.perf_counter()
    _, events = turn_events(session, text, None, max_tokens=128)
    summary = Session.collect(events)
    summary_s = time.perf_counter() - start
    start = time.perf_counter()
    _, events = turn_events(session, text, QUESTION, answer_prefix=PREFIX, max_tokens=8)
    answer = Session.collect(events)
    print(json.dumps({
        "tree": str(tree), "summary_s": round(summary_s, 1),
        "summary": summary.text[:300],
        "follow_s": round(time.perf_counter() - start, 2),
        "answer": answer.text,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
