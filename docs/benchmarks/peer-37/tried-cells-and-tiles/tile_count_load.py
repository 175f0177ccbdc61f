"""One server alone under the benchmark's 160x32 load (8 clients, streamed,
``ignore_eos``), with the tile-counting ``libggml-cpu`` (tile-count.patch) in
``LIBS``; prints the counts of the last dump (issue 37; kept with history.md's "Cells
left in place and prompt rows in tiles").

    .venv/bin/python docs/benchmarks/peer-37/tried-cells-and-tiles/tile_count_load.py peer - 4 8
    .venv/bin/python docs/benchmarks/peer-37/tried-cells-and-tiles/tile_count_load.py kvtrim T 4 8
    (args: peer or a name, T a kvtrim source tree, phases after one that warms up, clients)

``LIBS`` (default /tmp/patched) holds the patched libraries and a copy of llama-server
(its RPATH ``$ORIGIN`` then loads them); counts go to /tmp/tc_NAME.txt.
"""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT / "scripts" / "research"), str(ROOT)]
from interleaved import PER_PHASE, passages  # noqa: E402
from side_by_side import kvtrim_in, peer_in  # noqa: E402

from engine.bench import peer_client as pc  # noqa: E402
from engine.bench.peer_servers import ServerProcess  # noqa: E402
from engine.native.embedded import default_model_path  # noqa: E402

who, tree, phases, clients = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
libs = os.environ.get("LIBS", "/tmp/patched")
out = Path(f"/tmp/tc_{who}.txt")
out.unlink(missing_ok=True)
os.environ["GGML_TILE_COUNT"] = str(out)
model = str(default_model_path())
texts = passages("bench", model, PER_PHASE * (phases + 1), 160)
argv = (peer_in(f"{libs}/llama-server", model, clients) if who == "peer"
        else kvtrim_in(tree, model, clients, "shared", libs=libs))  # fmt: skip
with ServerProcess(argv, Path(tempfile.mkdtemp()) / "log") as url:
    for ph in range(phases + 1):
        batch, texts = texts[:PER_PHASE], texts[PER_PHASE:]
        got = pc.load(url, batch, clients, 32, True, 0.0, True)  # streamed, ignore_eos
        print(f"phase {ph}: {got['requests_per_s']:.3f} req/s", flush=True)
rows = [list(map(int, line.split())) for line in out.read_text().splitlines()]
q, c = sum(r[3] for r in rows), sum(r[4] for r in rows)
print(f"{who}: query tiles {q}, computed cell tiles {c}, {c / q:.2f} a query tile")
for r in sorted(rows, key=lambda r: -r[4])[:15]:
    print(f"  rows {r[0]:4d} n_kv {r[1]:5d}: calls {r[2]:6d} query tiles {r[3]:7d} "
          f"computed {r[4]:8d} ({r[4] / r[3]:.2f} a query tile)")  # fmt: skip
