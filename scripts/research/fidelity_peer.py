"""Do kvtrim's full cache and llama-server's agree on the fidelity items? (issue 34, item 4)

For the first ``--docs`` documents of each haystack at one length, the first question's
prompt, token for token as kvtrim's full cache read it (``ask_prompt`` +
``prompt_tokens``), goes to llama-server's ``/completion`` (greedy, the same stops and
``max_tokens``), and its answer is judged as the fidelity benchmark judges kvtrim's
(``fidelity_docs.judge``). Compared with the committed records of kvtrim's full cache:
right/wrong agreement, with Newcombe's paired interval of the difference, and the
answers that differ. Run it alone on the machine:

    .venv/bin/python scripts/research/fidelity_peer.py \\
        --records docs/benchmarks/fidelity/gemma3-270m --length 2048 --docs 6 \\
        --out docs/benchmarks/fidelity/gemma3-270m/peer-agreement.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engine.bench import fidelity_docs as docs  # noqa: E402
from engine.bench.fidelity import FidelityConfig, read_records  # noqa: E402
from engine.bench.intervals import paired_difference  # noqa: E402
from engine.bench.peer_servers import BUILD_SCRIPT  # noqa: E402
from engine.bench.ruler_peer import complete, server  # noqa: E402
from engine.native.model import resolve  # noqa: E402
from engine.runtime.engine import Engine  # noqa: E402
from engine.session.prompts import ask_prompt, prompt_tokens  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, required=True, help="a --fidelity OUT folder")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--docs", type=int, default=6, help="documents per haystack")
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--peer-binary", default=str(ROOT / ".variants/llama-server/llama-server"))
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not Path(args.peer_binary).is_file():
        sys.exit(f"no llama-server at {args.peer_binary}; build it: bash {BUILD_SCRIPT}")
    full = {
        (r["haystack"], r["doc"]): r
        for r in read_records(args.records / "fidelity.jsonl")
        if r["setting"] == "full" and r["path"] == "first" and r["length"] == args.length
        and not r.get("error")
    }  # fmt: skip
    cfg = FidelityConfig()
    items = []
    with Engine(args.model, n_threads=args.threads) as engine:
        model = engine.model
        log = args.out.with_suffix(".log")
        peer = server(
            args.peer_binary, str(resolve(args.model)), args.threads, args.length + 512, log
        )
        with peer as url:
            for name in cfg.haystacks:
                for index in range(args.docs):
                    mine = full.get((name, index))
                    if mine is None:
                        continue
                    doc = docs.make_document(model, name, args.length, index, cfg.seed)
                    if doc.digest != mine["digest"]:
                        print(f"{name} doc {index}: the text changed since the records; skipped")
                        continue
                    fact = doc.asked[0]
                    prompt = ask_prompt(model, doc.text, fact.question, fact.prefix)
                    head, tail, _ = prompt_tokens(model, prompt)
                    got = complete(url, head + tail, tuple(prompt.stops), cfg.max_tokens)
                    peer_right = docs.judge(fact, got["text"])["right"]
                    items.append({"haystack": name, "doc": index, "value": fact.value,
                                  "kvtrim": mine["answer"], "kvtrim_right": mine["right"],
                                  "peer": got["text"].strip(), "peer_right": peer_right,
                                  "error": got["error"]})  # fmt: skip
                    print(f"{name} doc {index}: kvtrim {mine['right']} llama-server {peer_right}")
    a = [bool(i["kvtrim_right"]) for i in items]
    b = [bool(i["peer_right"]) for i in items]
    diff, low, high = paired_difference(a, b)
    summary = {
        "items": len(items),
        "kvtrim_full_right": sum(a),
        "llama_server_right": sum(b),
        "agree": sum(x == y for x, y in zip(a, b, strict=True)),
        "same_text": sum(i["kvtrim"] == i["peer"] for i in items),
        "kvtrim_minus_peer_points": [round(100 * x) for x in (diff, low, high)],
    }
    args.out.write_text(json.dumps({"summary": summary, "items": items}, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
