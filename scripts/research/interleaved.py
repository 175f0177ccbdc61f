"""kvtrim serve against llama-server with both started once and kept, answering
phases of 16 requests in turn (llama-server then kvtrim, then the other way round):
each phase's requests/s, each pair's ratio, their median and a sign-test interval.

The peer benchmark starts each server for each configuration and round, minutes
apart, so its ratio carries the machine's drift over minutes; here a pair is two
phases of about ten seconds, side by side. A server waits idle while the other
runs (kvtrim's uses about 0.2% of a core, llama-server's none). Both get the
benchmark's command lines (``peer_servers``) and its client (the OpenAI SDK,
``peer_client.load``); ``--texts window`` sends the research scripts' passages
(pool_ab.py's, ending "In short,", up to ~270 tokens: llama-server gets 512 cells a
slot for them) instead of the benchmark's.

    .venv/bin/python scripts/research/interleaved.py --phases 12 --stream --ignore-eos

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pool_ab import passages as pool_ab_passages  # noqa: E402

from engine import Engine  # noqa: E402
from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer_servers import (  # noqa: E402
    KVTRIM,
    PEER,
    Launch,
    ServerProcess,
    kvtrim_argv,
    peer_argv,
)
from engine.bench.tasks import real_text  # noqa: E402
from engine.native.embedded import default_model_path  # noqa: E402

PER_PHASE = 16


def sign_interval(ratios: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The widest order-statistic range ``[s[k-1], s[n-k]]`` that holds the median
    with at least ``level`` (a sign test), and its coverage."""
    s, n = sorted(ratios), len(ratios)
    k, cover = 1, 1.0 - 2.0 * 0.5**n
    while k + 1 <= n // 2:
        nxt = 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k + 1)) * 0.5**n
        if nxt < level:
            break
        k, cover = k + 1, nxt
    return s[k - 1], s[n - k], cover


def passages(kind: str, model: str, count: int, tokens: int = 160) -> list[str]:
    """``count`` prompts: the benchmark's (``bench``, ``tokens`` tokens each) or the
    research scripts' (``window``, ~165 tokens)."""
    if kind == "window":
        return pool_ab_passages(count)
    with Engine(model, n_threads=2) as engine:
        return [real_text(engine, tokens, 3_000 + 5_000 * i) for i in range(count)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", type=int, default=12, help="pairs counted (one more warms up)")
    p.add_argument("--clients", type=int, default=8, help="clients, -np and --parallel")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--texts", choices=("bench", "window"), default="bench")
    p.add_argument("--peer-binary", default=str(ROOT / ".variants/llama-server/llama-server"))
    args = p.parse_args()
    model, n = str(default_model_path()), args.clients
    texts = passages(args.texts, model, 2 * PER_PHASE * (args.phases + 1))
    launches = {
        PEER: Launch(PEER, parallel=n, ctx=n * (256 if args.texts == "bench" else 512)),
        KVTRIM: Launch(KVTRIM, parallel=n, kv_cells=max(2048, n * 256)),
    }
    argv = {
        PEER: lambda port: peer_argv(args.peer_binary, model, port, 2, launches[PEER]),
        KVTRIM: lambda port: kvtrim_argv(model, port, 2, launches[KVTRIM]),
    }
    rates: dict[str, list[float]] = {PEER: [], KVTRIM: []}
    logs = Path(tempfile.mkdtemp())
    with contextlib.ExitStack() as stack:
        urls = {k: stack.enter_context(ServerProcess(argv[k], logs / f"{k}.log")) for k in argv}
        for phase in range(args.phases + 1):
            order = [PEER, KVTRIM] if phase % 2 == 0 else [KVTRIM, PEER]
            for j, name in enumerate(order):
                at = (2 * phase + j) * PER_PHASE
                got = pc.load(urls[name], texts[at : at + PER_PHASE], n, 32, args.stream,
                              0.0, args.ignore_eos)  # fmt: skip
                if phase:  # the first pair warms both up
                    rates[name].append(got["requests_per_s"])
    ratios = [k / p for p, k in zip(rates[PEER], rates[KVTRIM], strict=True)]
    low, high, cover = sign_interval(ratios)
    for name, rs in rates.items():
        print(f"{name:12s} req/s by phase: {' '.join(f'{r:.2f}' for r in rs)}")
    print(f"kvtrim / llama-server by pair, sorted: {' '.join(f'{r:.3f}' for r in sorted(ratios))}")
    print(f"median {statistics.median(ratios):.3f}, {cover:.1%} interval {low:.3f}-{high:.3f} "
          f"({args.texts} passages, {n} clients, {'streaming' if args.stream else 'plain'}"
          f"{', ignore_eos' if args.ignore_eos else ''})")  # fmt: skip


if __name__ == "__main__":
    main()
