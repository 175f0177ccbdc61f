"""Where a pooled answer step's time goes between two ``llama_decode`` calls (issue 37):
source trees' ``kvtrim serve`` (a commit and its parent, as git worktrees) alternating,
8 clients sending 32 distinct ~160-token completions of 32 tokens with ``ignore_eos``
after a 3-request warm-up; the server runs with timers wrapped around the scheduler's
decodes, the sequences' submits, the read-out of each step's logits and the sampler.
Each server start prints what a token of the rounds that read prompts cost, and
over its answer-only steps (one token per sequence): the
step's decode (read-out included), the time from its end to the next decode's start
(the sequences' Python), how long a sequence took to come back, per row the read-out
of its logits and the sampler, and the CPU time a request thread spent waiting in
``submit`` and between two submits (``time.thread_time``).

    git worktree add /tmp/before HEAD~1
    .venv/bin/python scripts/research/step_trace.py /tmp/before . --rounds 3

The timers add their own small cost to both trees. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _timed(record: list[float], fn: Any) -> Any:
    def wrapper(*a: Any, **k: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            record[0] += time.perf_counter() - t
            record[1] += 1

    return wrapper


def _serve_inside(out: str, argv: list[str]) -> None:
    """Run ``kvtrim serve`` from the current tree (nothing of this checkout's is
    imported here) with the timers; write them to ``out`` every 2 s (the server ends
    by a signal)."""
    sys.path.insert(0, os.getcwd())
    from engine.pool import scheduler as sch
    from engine.session import generate as gen

    rec: dict[str, Any] = {"runs": [], "sub": [], "read": [0.0, 0], "sample": [0.0, 0]}
    rec |= {"cpu_in": [], "cpu_between": []}
    run, submit = sch.Scheduler._run, sch.Scheduler.submit

    def _run(self: Any, steps: list[Any]) -> None:
        t0, n_tokens = time.perf_counter(), sum(len(s.tokens) for s in steps)
        run(self, steps)
        rec["runs"].append((t0, time.perf_counter(), [s.seq for s in steps], n_tokens))

    last_cpu: dict[int, float] = {}  # a request thread's CPU clock as its last submit ended

    def _submit(self: Any, seq: int, *a: Any, **k: Any) -> Any:
        t0, c0, tid = time.perf_counter(), time.thread_time(), threading.get_ident()
        if tid in last_cpu:
            rec["cpu_between"].append(c0 - last_cpu[tid])
        try:
            return submit(self, seq, *a, **k)
        finally:
            last_cpu[tid] = time.thread_time()
            rec["cpu_in"].append(last_cpu[tid] - c0)
            rec["sub"].append((seq, t0, time.perf_counter()))

    sch.Scheduler._run, sch.Scheduler.submit = _run, _submit  # type: ignore[method-assign]
    if hasattr(sch, "_read_out"):  # a module function since the read-out picks
        sch._read_out = _timed(rec["read"], sch._read_out)
    else:
        sch.Scheduler._read_out = _timed(rec["read"], sch.Scheduler._read_out)  # type: ignore[attr-defined]
    gen._sample_without = _timed(rec["sample"], gen._sample_without)

    def dump() -> None:
        while True:
            time.sleep(2)
            Path(out + ".tmp").write_text(json.dumps(rec))
            os.replace(out + ".tmp", out)

    threading.Thread(target=dump, daemon=True).start()
    sys.argv = ["kvtrim", *argv]
    runpy.run_module("app.main", run_name="__main__")


def _report(rec: dict[str, Any]) -> str:
    runs = sorted(rec["runs"])
    by_seq: dict[int, list[tuple[float, float]]] = {}
    for seq, called, returned in sorted(rec["sub"], key=lambda s: s[1]):
        by_seq.setdefault(seq, []).append((called, returned))
    decode, owed, back = [], [], []
    for (t0, t1, seqs, n_tokens), nxt in itertools.pairwise(runs):
        if n_tokens != len(seqs):  # a prompt chunk in it: not an answer step
            continue
        decode.append(t1 - t0)
        owed.append(nxt[0] - t1)
        for seq in seqs:
            subs = by_seq[seq]
            i = bisect.bisect_left([r for _, r in subs], t1 - 0.002)
            if i + 1 < len(subs) and subs[i + 1][0] <= nxt[0]:
                back.append(subs[i + 1][0] - t1)

    def ms(v: list[float]) -> str:
        return f"{1e3 * statistics.median(v):.2f} (p90 {1e3 * sorted(v)[int(0.9 * len(v))]:.2f})"

    def per(name: str) -> str:
        total, n = rec[name]
        return f"{1e3 * total / max(n, 1):.3f}"

    cpu_in, between = rec["cpu_in"], rec["cpu_between"]
    prompts = [(t1 - t0, n) for t0, t1, seqs, n in runs if n != len(seqs)]
    per_token = 1e3 * sum(s for s, _ in prompts) / max(sum(n for _, n in prompts), 1)
    return (
        f"{len(prompts)} rounds with prompts, {per_token:.3f} ms a token; "
        f"{len(decode)} answer steps, ms: decode {ms(decode)}, end to next decode {ms(owed)}, "
        f"a sequence back {ms(back)}; per row: read-out {per('read')}, sampler {per('sample')}; "
        f"a request thread's CPU a step, ms: waiting in submit {1e3 * statistics.mean(cpu_in):.3f}"
        f" (mean), between submits {ms(between)}"
    )


def _one(tree: Path, stream: bool, requests: int) -> str:
    from pool_ab import _port, _send, passages, wait_ready

    port = _port()
    out = Path(tempfile.mkdtemp()) / "trace.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-inside", str(out), "--",
           "serve", "--port", str(port), "--threads", "2", "--kv-cells", "2048",
           "--budget", "512", "--parallel", "8"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(tree))
    server = subprocess.Popen(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        prompts = passages(requests + 3)
        _send(url, prompts[requests:], 8, 32, stream, True)  # warm-up
        start = time.perf_counter()
        _send(url, prompts[:requests], 8, 32, stream, True)
        rate = requests / (time.perf_counter() - start)
        time.sleep(3)  # the last dump
        return f"{rate:.2f} req/s; " + _report(json.loads(out.read_text()))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-inside":
        _serve_inside(sys.argv[2], sys.argv[4:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs="+", type=Path, help="source trees, alternating")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--stream", action="store_true", help="streamed (server-sent events)")
    args = p.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "research")]
    for r in range(args.rounds):
        for tree in args.trees:
            line = _one(tree.resolve(), args.stream, args.requests)
            print(f"round {r} [{tree}]: {line}", flush=True)


if __name__ == "__main__":
    main()
