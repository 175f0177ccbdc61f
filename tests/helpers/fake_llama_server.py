"""A stand-in for llama.cpp's ``llama-server`` in tests of ``kvtrim bench --peer``:
takes llama-server's options (``-m --host --port -t -tb -np -c``), logs a KV cache
line as llama-server does, and serves with ``kvtrim serve`` (the full cache, a
slot's share of ``-c`` per request). Run it as ``python fake_llama_server.py ...``."""

from __future__ import annotations

import argparse
import sys

# what llama-server logs for a cache of -c cells (the benchmark sums such lines)
KV_LINE = (
    "llama_kv_cache: size = {mib:7.2f} MiB ({cells:6d} cells,   3 layers,  1/1 seqs), "
    "K (f16): {half:7.2f} MiB, V (f16): {half:7.2f} MiB"
)
BYTES_PER_CELL = 3072  # the default model's 3 global layers in f16


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-m", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("-t", type=int, default=1)
    p.add_argument("-tb", type=int, default=1)
    p.add_argument("-np", type=int, default=1)
    p.add_argument("-c", type=int, default=4096)
    args, _ = p.parse_known_args(argv)
    mib = args.c * BYTES_PER_CELL / 2**20
    print("llama_context: constructing llama_context", flush=True)
    print(KV_LINE.format(mib=mib, cells=args.c, half=mib / 2), flush=True)
    budget = max(args.c // args.np, 256)
    serve = ["serve", "--model", args.m, "--host", args.host, "--port", str(args.port)]
    serve += ["--threads", str(args.t), "--parallel", str(args.np), "--policy", "full"]
    serve += ["--budget", str(budget), "--max-queue", "64"]
    if args.np > 1:
        serve += ["--kv-cells", str(max(args.c, budget * args.np))]
    from engine.cli.main import main as kvtrim

    return kvtrim(serve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
