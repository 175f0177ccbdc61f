"""Time to the first token of a follow-up after a restart: restored from the saved
compressed cache (what the app and ``kvtrim chat`` do) against reading the document
again (what they did before). Each side runs in a process of its own, alternating, so
neither inherits the other's warm caches; run it alone on the machine.

    .venv/bin/python scripts/research/resume_ttft.py [--doc FILE] [--rounds 3]

Prints one JSON line per run and a summary: medians, the ratio, the file's size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

FIRST = "Summarize the document in one sentence."
FOLLOW_UP = "What is the pass key? Give the number."


def _first_token(events: Iterable[object]) -> tuple[float, str]:
    """Seconds to the first generated token, and the answer's text."""
    start, first, text = time.perf_counter(), None, ""
    for event in events:
        if getattr(event, "token", -1) >= 0 and first is None:
            first = time.perf_counter() - start
        text = getattr(event, "text", text) or text
    return (first if first is not None else float("nan")), text


def _child(mode: str, doc: Path, state: Path, policy: str, budget: int) -> dict:
    from engine import Engine, Session
    from engine.session.state import SavedState

    engine = Engine()
    session = engine.session(policy, budget)
    text = doc.read_text()
    out: dict = {"mode": mode}
    if mode == "save":
        start = time.perf_counter()
        Session.collect(session.ask(text, FIRST, max_tokens=24))
        out["first_answer_s"] = round(time.perf_counter() - start, 2)
        out["bytes"] = session.snapshot().write(state)
    elif mode == "resume":
        start = time.perf_counter()
        session.restore(SavedState.read(state))
        out["restore_s"] = round(time.perf_counter() - start, 3)
        ttft, answer = _first_token(
            session.follow_up(FOLLOW_UP, answer_prefix="The pass key is", max_tokens=8)
        )
        out["ttft_s"] = round(out["restore_s"] + ttft, 3)
        out["answer"] = answer
    else:  # reread: the document and the follow-up read afresh
        ttft, answer = _first_token(
            session.ask(text, FOLLOW_UP, answer_prefix="The pass key is", max_tokens=8)
        )
        out["ttft_s"] = round(ttft, 3)
        out["answer"] = answer
    session.close()
    engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, default=ROOT / "resources/samples/passkey.txt")
    parser.add_argument("--policy", default="snapkv")
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", choices=("save", "resume", "reread"))
    parser.add_argument("--state", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.doc, args.state, args.policy, args.budget)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "chat.kvstate"

        def run(mode: str) -> dict:
            cmd = [sys.executable, __file__, "--child", mode, "--doc", str(args.doc),
                   "--state", str(state), "--policy", args.policy,
                   "--budget", str(args.budget)]  # fmt: skip
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            result = json.loads(line.strip().splitlines()[-1])
            print(json.dumps(result), flush=True)
            return result

        saved = run("save")
        runs: dict[str, list[float]] = {"resume": [], "reread": []}
        for _ in range(args.rounds):
            for mode in ("reread", "resume"):
                runs[mode].append(run(mode)["ttft_s"])
    resume, reread = statistics.median(runs["resume"]), statistics.median(runs["reread"])
    print(json.dumps({
        "doc": args.doc.name, "policy": args.policy, "budget": args.budget,
        "saved_mib": round(saved["bytes"] / 2**20, 1), "resume_ttft_s": resume,
        "reread_ttft_s": reread, "ratio": round(resume / reread, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
