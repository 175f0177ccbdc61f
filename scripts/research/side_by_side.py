"""llama-server and several ``kvtrim serve`` builds kept up at once, answering phases
of 16 requests in a turned order (a Latin square and its mirror): each kvtrim's
requests/s over llama-server's and over the first kvtrim's, by pair, with the median
and a sign-test interval.

interleaved.py does this for two servers; with more, one run compares a change
against its parent and both against llama-server on the same minutes of the machine.
Each ``--kvtrim NAME=TREE[:LAYOUT[:POLICY]]`` is a source tree (a git worktree) run with
the benchmark's command line (``kvtrim_argv``), ``LAYOUT`` its ``--kv-layout`` and
``POLICY`` its ``--policy`` (the benchmark's SnapKV where none is named):

    git worktree add /tmp/before HEAD~1
    .venv/bin/python scripts/research/side_by_side.py --phases 12 \\
        --kvtrim before=/tmp/before --kvtrim after=. --kvtrim streams=.:streams

``--peer-kvu`` keeps a second llama-server up with ``--kv-unified``: one pool of cells
for all slots, the layout of kvtrim's default ``shared`` pool (llama-server's own
default with ``-np`` is a stream per slot, as kvtrim's ``streams``); it is compared
with llama-server, and each kvtrim with it too.

The benchmark's passages (~160 tokens), 32 tokens out with ``ignore_eos`` (``--eos``:
without, as the benchmark's 160x32 load; each server's answers under 32 tokens are
counted by phase, and a phase's servers answer the same passages; ``--lengths A-B``:
each request's length drawn from A..B, the same for every server (each its own
passages, as without ``--eos``), so clients fall out of step on the same work), its
client (the OpenAI SDK), 8 clients. Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shlex
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from interleaved import PER_PHASE, passages, sign_interval  # noqa: E402

from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer_servers import (  # noqa: E402
    KVTRIM,
    PEER,
    Launch,
    ServerProcess,
    kvtrim_argv,
    peer_argv,
)
from engine.native.embedded import default_model_path  # noqa: E402

UNIFIED = "llama-kvu"  # llama-server with one pool of cells for all its slots
# the most tokens --lengths may ask: llama-server's slots hold 256 cells and the
# passages ~161 tokens, so a longer answer would run out of its slot, not kvtrim's
MOST_TOKENS = 90


def kvtrim_in(
    tree: str, model: str, n: int, layout: str, libs: str = "", policy: str = ""
) -> Callable[[int], list[str]]:
    """``kvtrim serve``'s benchmark command line, run from source tree ``tree``
    (``libs``: a folder of llama.cpp libraries to load instead of the wheel's;
    ``policy``: another ``--policy`` than the benchmark's)."""
    env = f"LLAMA_CPP_LIB_PATH={shlex.quote(libs)} " if libs else ""

    def argv(port: int) -> list[str]:
        launch = Launch(KVTRIM, parallel=n, kv_cells=max(2048, n * 256), kv_layout=layout,
                        policy=policy or Launch.policy)  # fmt: skip
        line = shlex.join(kvtrim_argv(model, port, 2, launch))
        return ["bash", "-c", f"cd {shlex.quote(tree)} && {env}exec {line}"]

    return argv


def peer_in(binary: str, model: str, n: int, unified: bool = False) -> Callable[[int], list[str]]:
    """llama-server's benchmark command line for ``n`` slots of 256 cells (``unified``:
    one pool of cells for all of them, ``--kv-unified``)."""
    launch = Launch(PEER, parallel=n, ctx=n * 256)
    return lambda port: peer_argv(binary, model, port, 2, launch) + (["-kvu"] if unified else [])


def span(spec: str) -> tuple[int, int]:
    """``--lengths``: ``A-B`` or ``N`` as (A, B), 1 <= A <= B <= ``MOST_TOKENS``."""
    low, _, high = spec.partition("-")
    try:
        a, b = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not A-B or N") from None
    if not 1 <= a <= b <= MOST_TOKENS:
        raise argparse.ArgumentTypeError(f"lengths are 1 <= A <= B <= {MOST_TOKENS}")
    return a, b


def lengths(drawn: tuple[int, int] | None, phase: int) -> list[int]:
    """Each of a phase's requests' max_tokens: 32, or drawn from ``drawn`` (seeded by
    ``phase``, so every server gets the same)."""
    if drawn is None:
        return [32] * PER_PHASE
    draw = random.Random(phase)
    return [draw.randint(*drawn) for _ in range(PER_PHASE)]


def orders(k: int) -> list[list[int]]:
    """A Latin square of ``k`` servers and its mirror: each server in each place."""
    return [[(i + j) % k for j in range(k)] for i in range(k)] + [
        [(i - j) % k for j in range(k)] for i in range(k)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvtrim", action="append", required=True, help="NAME=TREE[:LAYOUT[:POLICY]]")
    p.add_argument("--phases", type=int, default=12, help="phases counted (one more warms up)")
    p.add_argument("--clients", type=int, default=8, help="clients, -np and --parallel")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--peer-binary", default=str(ROOT / ".variants/llama-server/llama-server"))
    p.add_argument("--peer-kvu", action="store_true", help="also llama-server --kv-unified")
    p.add_argument(
        "--lengths",
        type=span,
        default=None,
        help="A-B (or N): each request's max_tokens drawn from A..B (seeded by phase, the "
        "same for every server), ignore_eos: answers out of step, the same work for all",
    )
    p.add_argument(
        "--eos",
        action="store_true",
        help="answers may end before 32 tokens (no ignore_eos): the benchmark's load",
    )
    args = p.parse_args()
    model, n = str(default_model_path()), args.clients
    if args.lengths and args.eos:
        p.error("--lengths sets every answer's length: it goes without --eos")
    argv = {PEER: peer_in(args.peer_binary, model, n)}
    if args.peer_kvu:
        argv[UNIFIED] = peer_in(args.peer_binary, model, n, unified=True)
    for spec in args.kvtrim:
        name, _, where = spec.partition("=")
        tree, _, rest = where.partition(":")
        layout, _, policy = rest.partition(":")
        where = str(Path(tree).resolve())
        argv[name] = kvtrim_in(where, model, n, layout or "shared", policy=policy)
    names = list(argv)
    rates: dict[str, list[float]] = {x: [] for x in names}
    short: dict[str, list[int]] = {x: [] for x in names}  # answers cut short, by phase
    # with --eos an answer's length depends on its passage: a phase's servers share theirs
    per_turn = 1 if args.eos else len(names)
    texts = passages("bench", model, PER_PHASE * per_turn * (args.phases + 1))
    turns = orders(len(names))
    logs = Path(tempfile.mkdtemp())
    with contextlib.ExitStack() as stack:
        urls = {x: stack.enter_context(ServerProcess(argv[x], logs / f"{x}.log")) for x in names}
        for phase in range(args.phases + 1):
            most = lengths(args.lengths, phase)  # every server's, this phase
            for k, i in enumerate(turns[phase % len(turns)]):
                at = PER_PHASE * (phase * per_turn + (0 if args.eos else k))
                got = pc.load(urls[names[i]], texts[at : at + PER_PHASE], n, most, args.stream,
                              0.0, not args.eos)  # fmt: skip
                if phase:  # the first turn warms every server up
                    rates[names[i]].append(got["requests_per_s"])
                    asked = zip(got["completion_tokens"], most, strict=True)
                    short[names[i]].append(sum((c or 0) < m for c, m in asked))
    for x, rs in rates.items():
        print(f"{x:12s} req/s by phase: {' '.join(f'{r:.2f}' for r in rs)}")
        print(f"{'':12s} answers cut short: {' '.join(map(str, short[x]))}")
    kvtrims = [x for x in names if x not in (PEER, UNIFIED)]
    pairs = [(x, PEER) for x in names[1:]] + [(x, kvtrims[0]) for x in kvtrims[1:]]
    pairs += [(x, UNIFIED) for x in kvtrims if UNIFIED in names]
    load = f"{'streaming' if args.stream else 'plain'}, {'eos' if args.eos else 'ignore_eos'}"
    load += ", {}-{} tokens".format(*args.lengths) if args.lengths else ""
    for a, b in pairs:
        ratios = [u / v for u, v in zip(rates[a], rates[b], strict=True)]
        low, high, cover = sign_interval(ratios)
        print(f"{a} / {b}: median {statistics.median(ratios):.3f}, {cover:.1%} interval "
              f"{low:.3f}-{high:.3f} ({len(ratios)} pairs, {n} clients, "
              f"{load})")  # fmt: skip


if __name__ == "__main__":
    main()
