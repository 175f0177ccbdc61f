#!/usr/bin/env python3
"""The real model's numeric tests under other numerics, with each check's margin.

llama.cpp's CPU results differ in the last bits with the thread count, weight
repacking, the batch size and the instruction set it was built for, and a test
whose threshold was tuned on one CPU can fail on another (issue 26: an AVX-512
EPYC). This runs the tests that compare the model's output (agreement, KL,
logits, answers) once per variant, in a fresh pytest each, and reports for every
``margins.check`` its figure and smallest margin, and for every test how many
variants it passed.

    .venv/bin/python scripts/numeric_margins.py \\
        --lib avx2=/path/to/an/avx2/build/llama_cpp/lib --out docs/benchmarks/margins

Variants: threads x repacking x batch on the installed llama.cpp, then each
``--lib`` build (``$LLAMA_CPP_LIB_PATH``) at threads 2, batch 512, repacking on and off.
Run it alone: llama.cpp's threads spin, so a second model run slows both.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = [
    "tests/kv/test_kv_memory.py",
    "tests/session/test_session.py::test_passkey_question_aware_snapkv_beats_streaming",
    "tests/session/test_session.py::test_budget_larger_than_input_matches_plain_llama_cpp",
    "tests/session/test_session.py::test_chat_follow_ups_continue_the_cache_within_its_bound",
    "tests/session/test_recall.py",
    "tests/pool/test_pool.py::test_needles_found_together_are_the_ones_found_alone",
    "tests/serve/test_server.py::test_concurrent_requests_match_what_each_gets_alone",
    "tests/bench/test_bench.py::test_the_full_cache_is_its_own_reference",
    "tests/app/test_memory_view.py::test_real_needle_map_shows_the_kept_key",
    "tests/pool/test_multiseq_probe.py",
    "tests/cli/test_chat_cli.py::test_follow_up_after_eviction_brings_back_the_planted_fact",
    "tests/app/test_app_real.py::test_real_model_drop_summary_then_details_brought_back",
]


def variants(args: argparse.Namespace) -> list[dict[str, str]]:
    out = [
        {"cpu": "installed", "threads": str(t), "repack": r, "batch": str(b), "lib": ""}
        for t, r, b in itertools.product(args.threads, args.repack, args.batch)
    ]
    for spec, repack in itertools.product(args.lib, args.repack):
        name, _, path = spec.partition("=")
        out.append({"cpu": name, "threads": "2", "repack": repack, "batch": "512", "lib": path})
    return out


def label(v: dict[str, str]) -> str:
    return f"{v['cpu']} t{v['threads']} repack-{v['repack']} b{v['batch']}"


def run_variant(v: dict[str, str], tests: list[str], scratch: Path) -> dict[str, object]:
    """One pytest run under variant ``v``: each test's outcome and the checks' figures."""
    margins, junit = scratch / f"{label(v)}.jsonl", scratch / f"{label(v)}.xml"
    env = dict(os.environ)
    env.update(
        KVTRIM_TEST_THREADS=v["threads"],
        KVTRIM_REPACK=v["repack"],
        KVTRIM_TEST_BATCH=v["batch"],
        KVTRIM_MARGINS=str(margins),
        KVTRIM_VARIANT=label(v),
    )
    if v["lib"]:
        env["LLAMA_CPP_LIB_PATH"] = v["lib"]
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    proc = subprocess.run([*cmd, *tests], cwd=ROOT, env=env, capture_output=True, text=True)
    outcomes: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        bad = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        outcomes[name] = bad[0] if bad else "passed"
    checks = []
    if margins.exists():
        checks = [json.loads(line) for line in margins.read_text().splitlines()]
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    return {
        "variant": v,
        "label": label(v),
        "seconds": round(time.perf_counter() - start, 1),
        "summary": tail[0] if tail else f"exit {proc.returncode}",
        "outcomes": outcomes,
        "checks": checks,
    }


def markdown(runs: list[dict], command: str) -> str:
    lines = [
        "## Numeric tests under other numerics",
        "",
        f"Command: `{command}`. Each variant is a fresh pytest of the tests that compare "
        "the real model's output; `installed` is the llama.cpp that `scripts/setup.sh` "
        "built for this CPU, the others are builds for another instruction set "
        "(`$LLAMA_CPP_LIB_PATH`). Margin: how far the figure is on the passing side of "
        "its limit, the smallest over variants.",
        "",
        "| variant | result | s |",
        "|---|---|---|",
    ]
    lines += [f"| {r['label']} | {r['summary']} | {r['seconds']:.0f} |" for r in runs]
    by_check: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        for c in r["checks"]:
            by_check.setdefault((c["test"], c["check"]), []).append(c)
    lines += ["", "| test | check | limit | figures (min-max) | smallest margin |"]
    lines.append("|---|---|---|---|---|")
    for (test, name), cs in by_check.items():
        values = [c["value"] for c in cs]
        low = min(cs, key=lambda c: c["margin"])
        lines.append(
            f"| `{test.split('::', 1)[-1]}` | {name} | {cs[0]['op']} {cs[0]['limit']:g} | "
            f"{min(values):.4g}-{max(values):.4g} ({len(cs)} runs) | {low['margin']:.4g} |"
        )
    tests = sorted({t for r in runs for t in r["outcomes"]})
    lines += ["", "| test | passed / variants |", "|---|---|"]
    for t in tests:
        got = [r["outcomes"].get(t, "absent") for r in runs]
        passed = sum(o == "passed" for o in got)
        others = sorted({o for o in got if o != "passed"})
        extra = f" ({', '.join(others)})" if others else ""
        lines.append(f"| `{t.split('tests/', 1)[-1]}` | {passed} / {len(got)}{extra} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--repack", nargs="+", default=["on", "off"])
    p.add_argument("--batch", nargs="+", type=int, default=[256, 512])
    p.add_argument("--lib", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--tests", nargs="+", default=TESTS)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "margins")
    args = p.parse_args(argv)
    command = "python scripts/numeric_margins.py " + " ".join(argv or sys.argv[1:])
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvtrim-margins-") as tmp:
        for v in variants(args):
            r = run_variant(v, args.tests, Path(tmp))
            runs.append(r)
            print(f"{r['label']}: {r['summary']} ({r['seconds']:.0f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(runs, command.strip()))
    failed = [r for r in runs if {"failure", "error"} & set(r["outcomes"].values())]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
