"""A wave of 8 prompts of 161 tokens into an empty shared pool, three row orders
alternating in one process (issue 37; kept with history.md's "Cells left in place and
prompt rows in tiles"): ``last`` (each prompt's logits row after all other rows, as
``scheduler.batch_rows(tails_last=True)``), ``equal`` (pieces of 64 in turn, each
prompt's last piece after all others: the tried ``in_tiles``), ``natural``.

    .venv/bin/python docs/benchmarks/peer-37/tried-cells-and-tiles/wave_orders.py 8 - last,equal 13
    (args: prompts, model or -, orders, runs; the first run of each order warms up)

Prints each order's median wave time over the runs after the first. With the counting
library (tile-count.patch) and ``GGML_TILE_COUNT`` set, a run of one order counts its
tiles. Run it alone on the machine.
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from engine.bench.texts import window
from engine.native.context import NativeContext
from engine.native.model import Model

N, P = int(sys.argv[1]) if len(sys.argv) > 1 else 8, 161
model = Model(sys.argv[2] if len(sys.argv) > 2 and sys.argv[2] != "-" else None)
ctx = NativeContext(model, n_ctx=2048, n_batch=2048, n_ubatch=512, n_threads=2, capture=None,
                    flash_attn=True, n_seq_max=N, kv_unified=True)  # fmt: skip
doc = model.tokenize(window(11, 60000), add_bos=True)


def run(kind: str, r: int) -> tuple[float, float]:
    """Seconds of the wave in order ``kind``, and of 4 answer steps after it."""
    for s in range(N):
        ctx.seq_rm(0, -1, s)
    prompts = [doc[(N * (r % 8) + s) * P :][:P] for s in range(N)]
    bodies = [(s, t, i, False) for s, p in enumerate(prompts) for i, t in enumerate(p[:-1])]
    tails = [(s, p[-1], P - 1, True) for s, p in enumerate(prompts)]
    cut = [(a, min(P, a + 64)) for a in range(0, P, 64)]
    equal = [(s, p[i], i, i == P - 1) for a, b in cut[:-1] for s, p in enumerate(prompts)
             for i in range(a, b)]  # fmt: skip
    equal += [(s, p[i], i, i == P - 1) for s, p in enumerate(prompts) for i in range(*cut[-1])]
    natural = [(s, t, i, i == P - 1) for s, p in enumerate(prompts) for i, t in enumerate(p)]
    t0 = time.perf_counter()
    ctx.decode_batch({"last": bodies + tails, "equal": equal, "natural": natural}[kind])
    dt = time.perf_counter() - t0
    t1 = time.perf_counter()
    for k in range(4):
        ctx.decode_batch([(s, 100, P + k, True) for s in range(N)])
    return dt, time.perf_counter() - t1


kinds = sys.argv[3].split(",") if len(sys.argv) > 3 else ["last", "equal"]
times: dict[str, list[float]] = {k: [] for k in kinds}
steps: dict[str, list[float]] = {k: [] for k in kinds}
for r in range(int(sys.argv[4]) if len(sys.argv) > 4 else 11):
    for k in kinds if r % 2 else kinds[::-1]:
        dt, st = run(k, r)
        if r:
            times[k].append(dt)
            steps[k].append(st)
base = statistics.median(times[kinds[0]])
for k in kinds:
    m = statistics.median(times[k])
    print(f"{k:8s} wave {m * 1e3:7.1f} ms ({m / base:.3f}), min {min(times[k]) * 1e3:.1f}; "
          f"4 steps after {statistics.median(steps[k]) * 1e3:.1f} ms")  # fmt: skip
