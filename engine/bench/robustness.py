"""Does the README's demo hold under other numerics? (``kvtrim bench --robustness``)

llama.cpp's CPU results differ in the last bits with the thread count, flash
attention, weight repacking (AMX/AVX-512/AVX2 layouts) and the batch size, and
greedy text can flip on such bits. The demo is run here under each combination,
for the full cache, the README's policy and budget, and streaming at that budget
(which must miss: the key is outside its recent window).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..documents.load import load_document
from ..policies import Full, evicts
from ..runtime.engine import Engine
from ..session.core import Session

ROOT = Path(__file__).resolve().parents[2]
DEMO_FILE = ROOT / "resources" / "samples" / "passkey.txt"
DEMO_QUESTION = "What is the pass key? Give the number."
DEMO_PREFIX = "The pass key is"
DEMO_KEY = "68142"
DEMO_BUDGET = 1024
FULL_BUDGET = 10240


@dataclass(frozen=True)
class Variant:
    """One numeric setting: threads, flash attention, repacking, batch (tokens)."""

    threads: int
    flash_attn: str
    repack: str
    batch_tokens: int


def variants(
    threads: tuple[int, ...] = (1, 2),
    flash: tuple[str, ...] = ("off", "on"),
    repack: tuple[str, ...] = ("on", "off"),
    batches: tuple[int, ...] = (256, 512),
) -> list[Variant]:
    return [Variant(*v) for v in itertools.product(threads, flash, repack, batches)]


def runs(policies: tuple[str, ...] = ("full", "snapkv", "streaming")) -> Iterator[tuple[str, int]]:
    for policy in policies:
        yield policy, DEMO_BUDGET if evicts(policy) else FULL_BUDGET


def _one(engine: Engine, text: str, policy: str, budget: int, v: Variant) -> dict[str, Any]:
    engine.n_threads = v.threads
    start = time.perf_counter()
    with engine.session(
        policy, budget, flash_attn=v.flash_attn, batch_tokens=v.batch_tokens
    ) as session:
        events = session.ask(text, DEMO_QUESTION, answer_prefix=DEMO_PREFIX, max_tokens=12)
        result = Session.collect(events)
    answer = f"{DEMO_PREFIX} {result.text.strip()}"
    return {
        "task": "robustness",
        "policy": policy,
        "budget_tokens": budget,
        **asdict(v),
        "answer": answer,
        "hit": DEMO_KEY in answer,
        "prompt_tokens": result.stats.prompt_tokens,
        "seconds": time.perf_counter() - start,
    }


def run_robustness(
    model: str | None,
    step: Callable[[str], None],
    grid: list[Variant] | None = None,
    policies: tuple[str, ...] = ("full", "snapkv", "streaming"),
    text: str | None = None,
) -> list[dict[str, Any]]:
    """The demo under every variant (a policy that reads attention with flash attention
    on computes its rows from the fused node's inputs)."""
    text = text if text is not None else load_document(DEMO_FILE)
    grid = grid or variants()
    records: list[dict[str, Any]] = []
    for repack in sorted({v.repack for v in grid}, reverse=True):
        with Engine(model, repack=repack) as engine:
            for policy, budget in runs(policies):
                for v in grid:
                    if v.repack != repack:
                        continue
                    record = _one(engine, text, policy, budget, v)
                    records.append(record)
                    step(
                        f"robustness {policy} t{v.threads} fa-{v.flash_attn} "
                        f"repack-{repack} b{v.batch_tokens}: {record['hit']}"
                    )
    return records


def summary(records: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{policy: (hits, runs)}``."""
    out: dict[str, tuple[int, int]] = {}
    for r in records:
        hits, n = out.get(r["policy"], (0, 0))
        out[r["policy"]] = (hits + bool(r["hit"]), n + 1)
    return out


def repack_cost(
    model: str | None, text: str, rounds: int = 3, decode_tokens: int = 64
) -> list[dict[str, Any]]:
    """Prefill and decode tokens/s with repacking on and off, alternating the two
    ``rounds`` times so that a noisy machine hits both alike (full cache, greedy)."""
    records: list[dict[str, Any]] = []
    engines = {mode: Engine(model, repack=mode) for mode in ("on", "off")}
    try:
        for _ in range(rounds):
            for mode, engine in engines.items():
                tokens = engine.model.tokenize(text, add_bos=True)
                with engine.session(Full.name, len(tokens) + decode_tokens + 16) as session:
                    events = session.run_tokens(tokens[:-8], tokens[-8:], max_tokens=decode_tokens)
                    s = Session.collect(events).stats
                records.append(
                    {
                        "task": "repack_cost",
                        "repack": mode,
                        "prompt_tokens": s.prompt_tokens,
                        "prefill_tokens_per_s": s.prefill_tokens_per_s,
                        "decode_tokens_per_s": s.decode_tokens_per_s,
                    }
                )
    finally:
        for engine in engines.values():
            engine.close()
    return records


def markdown(records: list[dict[str, Any]], cost: list[dict[str, Any]], command: str) -> str:
    """The robustness table, its summary and the repacking cost, as Markdown."""
    lines = [
        "## Robustness: the README's demo under other numerics",
        "",
        f"Command: `{command}`. The README's first command (`{DEMO_FILE.name}`, "
        f'"{DEMO_QUESTION}", answer prefix "{DEMO_PREFIX}", key {DEMO_KEY}) with every '
        "combination of threads, flash attention, llama.cpp's weight repacking and batch "
        "size. Policies that read attention always run with flash attention off, so they "
        "have half the rows.",
        "",
        "| policy | budget | right | runs |",
        "|---|---|---|---|",
    ]
    for policy, (hits, n) in summary(records).items():
        budget = next(r["budget_tokens"] for r in records if r["policy"] == policy)
        lines.append(f"| {policy} | {budget} | {hits} | {n} |")
    lines += [
        "",
        "| policy | threads | flash attn | repack | batch | answer | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        mark = "right" if r["hit"] else "wrong"
        lines.append(
            f"| {r['policy']} | {r['threads']} | {r['flash_attn']} | {r['repack']} | "
            f"{r['batch_tokens']} | {r['answer']!r} ({mark}) | {r['seconds']:.1f} |"
        )
    if cost:
        lines += ["", *repack_cost_lines(cost)]
    return "\n".join(lines) + "\n"


def repack_cost_lines(cost: list[dict[str, Any]]) -> list[str]:
    """Median prefill/decode tok/s with repacking on and off, and off/on."""
    import statistics

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in cost if r["repack"] == mode)

    pre = (med("on", "prefill_tokens_per_s"), med("off", "prefill_tokens_per_s"))
    dec = (med("on", "decode_tokens_per_s"), med("off", "decode_tokens_per_s"))
    n = cost[0]["prompt_tokens"]
    return [
        f"Repacking off against on, full cache, {n:,}-token prompt, median of "
        f"{len(cost) // 2} alternating rounds:",
        "",
        "| | repack on | repack off | off / on |",
        "|---|---|---|---|",
        f"| prefill tok/s | {pre[0]:.0f} | {pre[1]:.0f} | {pre[1] / pre[0]:.2f} |",
        f"| decode tok/s | {dec[0]:.1f} | {dec[1]:.1f} | {dec[1] / dec[0]:.2f} |",
    ]
