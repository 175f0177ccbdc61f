"""The benchmark's 16 streaming passages (~160 tokens, 32 tokens out, no ``ignore_eos``)
from N clients, each server started fresh for each phase (no prompt cache carries over):
llama-server as the benchmark runs it, llama-server given kvtrim's answer lengths as
each request's ``max_tokens``, and kvtrim. kvtrim's loop guard ends an answer that
repeats itself, which llama-server writes out to 32 tokens; the second llama-server
does kvtrim's work, so the ratios split kvtrim's gap into the cost of the shorter
answers (a client whose answer ends early falls out of step with the others) and the
rest. kvtrim's lengths come from one client first (no pool: the same every run); with
several, its answers can differ from them, and the script counts the phases where
they did not.

    .venv/bin/python scripts/research/matched_lengths.py --phases 9

Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from interleaved import passages, sign_interval  # noqa: E402
from side_by_side import kvtrim_in, peer_in  # noqa: E402

from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer_servers import ServerProcess  # noqa: E402
from engine.native.embedded import default_model_path  # noqa: E402

GEN = 32
LLAMA, MATCHED, KV = "llama-server", "llama-matched", "kvtrim"


def phase(
    url: str, texts: list[str], clients: int, lengths: dict[int, int], warm: str
) -> tuple[float, list[int]]:
    """Requests/s of ``texts`` streamed from ``clients`` clients (``peer_client.load``,
    after one request of ``warm``, a passage none of them starts with), each with
    ``lengths[i]`` tokens at most (else ``GEN``); the answers' lengths. A failed
    request fails the phase."""
    api = pc.client(url)
    pc.complete(api, warm, 4)
    api.close()
    most = [lengths.get(i, GEN) for i in range(len(texts))]
    got = pc.load(url, texts, clients, most, stream=True)
    counts = got["completion_tokens"]
    if None in counts:
        raise RuntimeError(f"{url}: an answer without completion_tokens")
    return got["requests_per_s"], counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", type=int, default=9)
    p.add_argument("--clients", type=int, default=4, help="clients, -np and --parallel")
    p.add_argument("--layout", default="shared", help="kvtrim's --kv-layout")
    p.add_argument("--peer-binary", default=str(ROOT / ".variants/llama-server/llama-server"))
    args = p.parse_args()
    model, n = str(default_model_path()), args.clients
    every = passages("bench", model, 33)
    texts, warm = every[16:32], every[32]  # the benchmark's streaming passages; a warm-up
    logs = Path(tempfile.mkdtemp())
    with ServerProcess(kvtrim_in(str(ROOT), model, 1, "shared"), logs / "one.log") as url:
        _, alone = phase(url, texts, 1, {}, warm)
    lengths = {i: k for i, k in enumerate(alone) if k < GEN}
    print(f"kvtrim's answers under {GEN} tokens, one client (passage: tokens): {lengths}")
    argv = {
        LLAMA: peer_in(args.peer_binary, model, n),
        MATCHED: peer_in(args.peer_binary, model, n),
        KV: kvtrim_in(str(ROOT), model, n, args.layout),
    }
    rates: dict[str, list[float]] = {x: [] for x in argv}
    names, same = list(argv), 0
    for k in range(args.phases):
        for name in names[k % 3 :] + names[: k % 3]:  # each server first in turn
            with ServerProcess(argv[name], logs / f"{name}.log") as url:
                rate, got = phase(url, texts, n, lengths if name == MATCHED else {}, warm)
            rates[name].append(rate)
            short = {i: c for i, c in enumerate(got) if c < GEN}
            same += name == KV and short == lengths
            print(f"phase {k} {name:13s} {rate:.2f} req/s, answers under {GEN}: {short}")
    print(f"kvtrim's answers had one client's lengths in {same} of {args.phases} phases "
          "(the shared pool's greedy answers move with the order requests arrive in)")  # fmt: skip
    for a, b in ((KV, LLAMA), (KV, MATCHED), (MATCHED, LLAMA)):
        ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        low, high, cover = sign_interval(ratios)
        print(f"{a} / {b}: median {statistics.median(ratios):.3f}, {cover:.1%} interval "
              f"{low:.3f}-{high:.3f} ({len(ratios)} phases, {n} clients, streaming)")  # fmt: skip


if __name__ == "__main__":
    main()
