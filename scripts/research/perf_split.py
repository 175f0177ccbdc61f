"""Where each server's CPU goes, by function: llama-server and one ``kvtrim serve`` kept
up at once, phases of 16 requests in turn, each phase recorded by ``perf`` (the
``cpu-clock`` software event, every CPU) and split by function for that server's
process only; prints samples a phase for each server and the functions that differ
most.

kvtrim loads the llama.cpp libraries llama-server was built with
(``LLAMA_CPP_LIB_PATH``): pip strips its own, so their functions would have no
names, and the same libraries on both sides leave only what each server asks of
them. Both servers keep both cores busy, so samples a phase stand for its wall time
(997 a second a core). Needs ``perf`` allowed to record every CPU (root, or
``perf_event_paranoid`` <= 0 or CAP_PERFMON); run it alone on the machine:

    .venv/bin/python scripts/research/perf_split.py --phases 6 --stream
    .venv/bin/python scripts/research/perf_split.py --layout streams --prompt 64 --gen 96
    .venv/bin/python scripts/research/perf_split.py --peer-kvu   # llama-server -kvu

The benchmark's client (the OpenAI SDK), ``ignore_eos``, 8 clients by default.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from interleaved import PER_PHASE, passages  # noqa: E402
from side_by_side import kvtrim_in, peer_in  # noqa: E402

from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer_servers import KVTRIM, PEER, ServerProcess  # noqa: E402
from engine.native.embedded import default_model_path  # noqa: E402

HZ = 997  # samples a second a CPU
_LINE = re.compile(r"\s*\S+\s+(\d+)/\d+\s+[0-9a-f]+\s+(.*)")


@contextlib.contextmanager
def recording(path: Path) -> Iterator[None]:
    """``perf record`` of every CPU into ``path`` while the block runs (one process
    followed by ``-p`` made perf itself busy on a Python server); stopped with
    SIGINT whatever ends the block, killed if it does not stop in 10 s."""
    argv = ["perf", "record", "-e", "cpu-clock", "-F", str(HZ), "-a", "-o", str(path)]
    log = path.with_suffix(".log")
    with open(log, "wb") as err:
        perf = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 10
        while not path.exists() or path.stat().st_size == 0:  # perf writes its header
            if perf.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"perf record did not start: {log.read_text()[-400:]}")
            time.sleep(0.05)
        time.sleep(0.2)  # its sampling is armed after the header
        yield
    finally:
        perf.send_signal(signal.SIGINT)
        try:
            perf.wait(timeout=10)
        except subprocess.TimeoutExpired:
            perf.kill()
            perf.wait()


def split(
    data: Path, pid: int
) -> tuple[collections.Counter[tuple[str, str]], collections.Counter[str]]:
    """Samples of process ``pid`` in ``data`` by (library, function), and every sample
    of the machine by whose it was: the server, this script (the clients), idle (the
    kernel's idle task) or other."""
    out = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got: collections.Counter[tuple[str, str]] = collections.Counter()
    whose: collections.Counter[str] = collections.Counter()
    me = os.getpid()
    for line in out.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        owner = int(m.group(1))
        whose["server" if owner == pid else "clients" if owner == me else
              "idle" if owner == 0 else "other"] += 1  # fmt: skip
        if owner != pid:
            continue
        sym, _, dso = re.sub(r"\+0x[0-9a-f]+", "", m.group(2)).rpartition(" (")
        lib = dso.rstrip(")").rsplit("/", 1)[-1].split(".so")[0]
        got[(lib, sym.strip() or "?")] += 1
    return got, whose


def servers(args: argparse.Namespace, model: str) -> dict[str, ServerProcess]:
    """The two servers' processes (not started), by name."""
    n, binary = args.clients, args.peer_binary
    libs = args.kvtrim_libs or str(Path(binary).resolve().parent)
    mine = kvtrim_in(str(ROOT), model, n, args.layout, libs=libs)
    logs = Path(tempfile.mkdtemp())
    return {
        PEER: ServerProcess(peer_in(binary, model, n, args.peer_kvu), logs / "peer.log"),
        KVTRIM: ServerProcess(mine, logs / "kvtrim.log"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phases", type=int, default=6, help="phases each (one more warms up)")
    p.add_argument("--clients", type=int, default=8, help="clients, -np and --parallel")
    p.add_argument("--layout", default="shared", help="kvtrim's --kv-layout")
    p.add_argument("--peer-kvu", action="store_true", help="llama-server with --kv-unified")
    p.add_argument("--prompt", type=int, default=160, help="prompt tokens a request")
    p.add_argument("--gen", type=int, default=32, help="tokens out a request")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--top", type=int, default=25, help="functions shown")
    p.add_argument("--peer-binary", default=str(ROOT / ".variants/llama-server/llama-server"))
    p.add_argument(
        "--kvtrim-libs",
        default="",
        help="llama.cpp libraries kvtrim loads (default: llama-server's, beside its binary)",
    )
    args = p.parse_args()
    model = str(default_model_path())
    texts = passages("bench", model, PER_PHASE * 2 * (args.phases + 1), args.prompt)
    procs, out = servers(args, model), Path(tempfile.mkdtemp())
    by: dict[str, collections.Counter[tuple[str, str]]] = {x: collections.Counter() for x in procs}
    machine: dict[str, collections.Counter[str]] = {x: collections.Counter() for x in procs}
    with contextlib.ExitStack() as stack:
        urls = {x: stack.enter_context(proc) for x, proc in procs.items()}
        for phase in range(args.phases + 1):
            for x in list(procs)[:: 1 if phase % 2 else -1]:
                batch, texts = texts[:PER_PHASE], texts[PER_PHASE:]
                if not phase:  # the first turn warms both servers up
                    pc.load(urls[x], batch, args.clients, args.gen, args.stream, 0.0, True)
                    continue
                with recording(out / f"{x}-{phase}.data"):
                    got = pc.load(urls[x], batch, args.clients, args.gen, args.stream, 0.0, True)
                pid = procs[x].proc.pid  # type: ignore[union-attr]  # started
                funcs, whose = split(out / f"{x}-{phase}.data", pid)
                by[x] += funcs
                machine[x] += whose
                print(f"phase {phase} {x}: {got['requests_per_s']:.3f} req/s", flush=True)
    report(by, machine, args.phases, args.top)


def report(
    by: dict[str, collections.Counter[tuple[str, str]]],
    machine: dict[str, collections.Counter[str]],
    phases: int,
    top: int,
) -> None:
    """Samples a phase of each server, the machine's samples by whose they were (idle
    samples are cores the server left unused), and the ``top`` functions by difference."""
    for x, c in by.items():
        whose = ", ".join(f"{k} {v / phases:.0f}" for k, v in sorted(machine[x].items()))
        print(f"{x}: {sum(c.values()) / phases:.0f} samples a phase; the machine's: {whose}")
    a, b = by[KVTRIM], by[PEER]
    keys = sorted(set(a) | set(b), key=lambda k: -abs(a[k] - b[k]))
    print(f"{'kvtrim - peer':>13s} {'kvtrim':>8s} {'peer':>8s}  library  function (a phase)")
    for k in keys[:top]:
        print(f"{(a[k] - b[k]) / phases:+13.1f} {a[k] / phases:8.1f} {b[k] / phases:8.1f}  "
              f"{k[0]}  {k[1][:80]}")  # fmt: skip


if __name__ == "__main__":
    main()
