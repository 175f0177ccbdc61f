"""Throughput against concurrency: many requests in one context (engine/pool/kvpool.py).

Three parts, each measured in one run so that ratios compare like with like:

- ``server``: ``kvtrim serve`` on loopback, N clients in flight (1, 2, 4, 8),
  each prompt ~150 tokens with a pass key, 32 tokens generated greedily; the
  parallel server (one pool of ``server_cells`` KV cells for every N) against
  the one-at-a-time server. Requests/s, latency p50/p95, and whether each
  request's pass key is the one the one-at-a-time server finds.
- ``summarize``: 8 documents of 2K-8K tokens summarized one by one and with
  ``--parallel 4`` (shares by length and even), the pool holding the KV cells
  of one document's session; wall time, peak cells and KV bytes.
- ``needles``: documents with a pass key asked alone and together (a pool with
  room for every session whole: only batching differs), and in a pool of two
  sessions' cells (half what the four need) split by length or evenly.

Units: seconds, bytes, cells (one cell holds one token of every layer).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..native.kvmemory import pad
from ..policies import make_policy
from ..pool.kvpool import QUESTION_ROOM, SLACK, KVPool
from ..runtime.batch import FileSummary, Source, summarize_many
from ..runtime.engine import Engine
from ..runtime.spec import RequestSpec
from ..session.core import default_threads
from ..session.prompts import ask_prompt
from .records import Records
from .tasks import key_for, real_text

PARTS = ("server", "summarize", "needles")
QUESTION = "What is the pass key? Give the number."
PREFIX = "The pass key is"


@dataclass
class ConcurrencyConfig:
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    clients: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    requests: int = 16  # per concurrency level
    prompt_tokens: int = 150
    gen_tokens: int = 32
    server_budget: int = 512  # a request's budget
    server_cells: int = 2048  # the KV cells all parallel requests share
    doc_tokens: list[int] = field(
        default_factory=lambda: [2000, 2800, 3600, 4400, 5200, 6000, 6800, 8000]
    )
    summary_budget: int = 1024
    summary_tokens: int = 128
    parallel: int = 4
    needle_tokens: list[int] = field(default_factory=lambda: [600, 1500, 2500, 4000])
    needle_budget: int = 512
    seed: int = 1

    @classmethod
    def quick(cls) -> ConcurrencyConfig:
        return cls(
            clients=[1, 4],
            requests=4,
            doc_tokens=[1200, 2000, 1600, 800],
            summary_tokens=32,
            parallel=2,
            needle_tokens=[600, 1200],
        )


def _key_text(engine: Engine, n_tokens: int, key: int, offset: int) -> str:
    half = real_text(engine, n_tokens // 2, offset)
    rest = real_text(engine, n_tokens - n_tokens // 2, offset + 50_000)
    return f"{half} The pass key is {key}. Remember it. {key} is the pass key. {rest}"


def _completion(text: str) -> str:
    return f"{text}\n{QUESTION}\n{PREFIX}"


# ---------------------------------------------------------------- server


def _serve(engine: Engine, cfg: ConcurrencyConfig, parallel: int, layout: str) -> Any:
    from ..serve.api import ServerConfig, create_app
    from ..serve.background import BackgroundServer

    config = ServerConfig(
        policy="snapkv",
        budget_tokens=cfg.server_budget,
        max_queue=64,
        parallel=parallel,
        kv_cells=cfg.server_cells,
        layout=layout,
    )
    return BackgroundServer(create_app(engine, config))


def _load(url: str, prompts: list[str], clients: int, gen: int) -> dict[str, Any]:
    """``prompts`` sent by ``clients`` threads, each sending its next one when its
    last answer came; latencies in seconds, answers in prompt order."""
    answers: list[str] = [""] * len(prompts)
    latencies: list[float] = [0.0] * len(prompts)
    tokens = [0] * len(prompts)
    nxt = iter(range(len(prompts)))
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(timeout=600) as http:
            while True:
                with lock:
                    i = next(nxt, None)
                if i is None:
                    return
                body = {"prompt": prompts[i], "max_tokens": gen, "temperature": 0}
                t0 = time.perf_counter()
                r = http.post(f"{url}/v1/completions", json=body)
                r.raise_for_status()
                latencies[i] = time.perf_counter() - t0
                out = r.json()
                answers[i] = out["choices"][0]["text"]
                tokens[i] = out["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(client) for _ in range(clients)]:
            f.result()
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "requests_per_s": len(prompts) / wall,
        "generated_tokens_per_s": sum(tokens) / wall,
        "latency_p50_s": statistics.median(latencies),
        "latency_p95_s": sorted(latencies)[max(0, int(0.95 * len(latencies)) - 1)],
        "answers": answers,
        "generated_tokens": tokens,
    }


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("kvtrim_pool_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def server_part(engine: Engine, cfg: ConcurrencyConfig, emit: Callable[[dict], None]) -> None:
    keys = [key_for(cfg.seed, 0.5, i) for i in range(cfg.requests)]
    prompts = [
        _completion(_key_text(engine, cfg.prompt_tokens - 30, k, 7_000 * i))
        for i, k in enumerate(keys)
    ]
    n_prompt = [len(engine.model.tokenize(p, add_bos=True)) for p in prompts]
    base: list[str] | None = None
    most = max(cfg.clients)
    runs = ((1, "shared", [1, most]), (most, "shared", cfg.clients), (most, "streams", cfg.clients))
    for parallel, layout, levels in runs:
        with _serve(engine, cfg, parallel, layout) as url:
            _load(url, prompts[:2], 1, 4)  # warm-up: first-request costs out of the figures
            for clients in levels:
                got = _load(url, prompts, clients, cfg.gen_tokens)
                if base is None:
                    base = got["answers"]
                record = {
                    "part": "server",
                    "server_parallel": parallel,
                    "layout": layout,
                    "clients": clients,
                    "requests": len(prompts),
                    "prompt_tokens_mean": statistics.mean(n_prompt),
                    "kv_cells": cfg.server_cells if parallel > 1 else None,
                    "key_hits": sum(str(k) in a for k, a in zip(keys, got["answers"], strict=True)),
                    "same_key_as_alone": sum(
                        (str(k) in a) == (str(k) in b)
                        for k, a, b in zip(keys, got["answers"], base, strict=True)
                    ),
                    **got,
                    "pool": _metrics(url) if parallel > 1 else {},
                }
                emit(record)


# ---------------------------------------------------------------- summarize


def summarize_part(
    engine: Engine, cfg: ConcurrencyConfig, out_dir: Path, emit: Callable[[dict], None]
) -> None:
    folder = out_dir / "concurrency-docs"
    folder.mkdir(parents=True, exist_ok=True)
    sources = []
    for i, n in enumerate(cfg.doc_tokens):
        path = folder / f"doc{i}-{n}.txt"
        path.write_text(real_text(engine, n, 20_000 + 9_000 * i))
        sources.append(Source(path, Path(path.name)))
    settings = RequestSpec(budget_tokens=cfg.summary_budget, max_tokens=cfg.summary_tokens)
    runs = [
        (1, "length", "shared"),
        (cfg.parallel, "length", "shared"),
        (cfg.parallel, "even", "shared"),
        (cfg.parallel, "length", "streams"),
    ]
    for parallel, share, layout in runs:
        pools: list[KVPool] = []
        start = time.perf_counter()
        results = summarize_many(
            engine,
            sources,
            out_dir / f"concurrency-summaries-{parallel}-{share}-{layout}",
            settings,
            parallel=parallel,
            share=share,
            pools=pools,
            layout=layout,
        )
        wall = time.perf_counter() - start
        emit(_summary_record(engine, results, parallel, share, wall, pools) | {"layout": layout})


def _summary_record(
    engine: Engine,
    results: list[FileSummary],
    parallel: int,
    share: str,
    wall: float,
    pools: list[KVPool],
) -> dict[str, Any]:
    stats = [r.stats for r in results if r.stats is not None]
    layout = engine.model.info.kv_layout()
    if pools:
        snap = pools[0].snapshot()
        cells, swa = snap["n_ctx"], pools[0].ctx.swa_cells
        peak_cells = snap["peak_cells"]
        steps, mean_batch = snap["steps"], snap["mean_batch_tokens"]
    else:
        cells = max(s.n_ctx for s in stats)
        swa = max(s.swa_cells for s in stats)
        peak_cells = max(s.cells_peak for s in stats)
        steps, mean_batch = None, None
    return {
        "part": "summarize",
        "parallel": parallel,
        "share": share,
        "documents": len(results),
        "failed": sum(r.error is not None for r in results),
        "prompt_tokens": sum(s.prompt_tokens for s in stats),
        "wall_s": wall,
        "doc_seconds": [r.seconds for r in results],
        "global_cells_allocated": cells,
        "swa_cells_allocated": swa,
        "peak_cells_held": peak_cells,
        "kv_bytes_allocated": cells * layout.global_cell_bytes + swa * layout.swa_cell_bytes,
        "evictions": sum(s.evictions for s in stats),
        "decode_steps": steps,
        "mean_batch_tokens": mean_batch,
        "summaries": [r.text[:200] for r in results],
    }


# ---------------------------------------------------------------- needles


def _ask(session: Any, doc: str) -> str:
    result = session.collect(session.ask(doc, QUESTION, answer_prefix=PREFIX, max_tokens=12))
    return result.text


def needles_part(engine: Engine, cfg: ConcurrencyConfig, emit: Callable[[dict], None]) -> None:
    keys = [key_for(cfg.seed + 1, 0.5, i) for i in range(len(cfg.needle_tokens))]
    docs = [
        _key_text(engine, n, k, 40_000 + 11_000 * i)
        for i, (n, k) in enumerate(zip(cfg.needle_tokens, keys, strict=True))
    ]
    budget = cfg.needle_budget
    start = time.perf_counter()
    alone = []
    for doc in docs:
        with engine.session("snapkv", budget) as s:
            alone.append(_ask(s, doc))
    alone_s = time.perf_counter() - start
    whole = len(docs) * (budget + budget // 4 + QUESTION_ROOM + SLACK)
    one = budget + budget // 4 + QUESTION_ROOM + SLACK
    for label, cells, share, layout in (
        ("room for every session", whole, "length", "shared"),
        ("room for every session, one stream each", len(docs) * pad(one), "length", "streams"),
        ("two sessions' cells, by length", one * 2, "length", "shared"),
        ("two sessions' cells, even", one * 2, "even", "shared"),
    ):
        answers, wall, snap = _together(engine, docs, budget, cells, share, layout)
        emit(
            {
                "part": "needles",
                "pool": label,
                "cells": cells,
                "share": share,
                "layout": layout,
                "documents": len(docs),
                "doc_tokens": cfg.needle_tokens,
                "alone_hits": sum(str(k) in a for k, a in zip(keys, alone, strict=True)),
                "together_hits": sum(str(k) in a for k, a in zip(keys, answers, strict=True)),
                "same_key_as_alone": sum(
                    (str(k) in a) == (str(k) in b)
                    for k, a, b in zip(keys, answers, alone, strict=True)
                ),
                "alone_s": alone_s,
                "together_s": wall,
                "answers_alone": alone,
                "answers_together": answers,
                "shares": snap,
            }
        )


def _together(
    engine: Engine, docs: list[str], budget: int, cells: int, share: str, layout: str
) -> tuple[list[str], float, list[int]]:
    model = engine.model
    answers = [""] * len(docs)
    shares = [0] * len(docs)
    with KVPool(
        model,
        cells=cells,
        max_seqs=len(docs),
        n_threads=default_threads(),
        share=share,
        layout=layout,
    ) as pool:

        def job(i: int) -> None:
            p = ask_prompt(model, docs[i], QUESTION, PREFIX)
            n = len(model.tokenize(p.prefix + p.document + p.suffix)) + 12
            session = pool.open(make_policy("snapkv"), engine.config(budget), n)
            with session:
                shares[i] = session.ctx.n_ctx  # when it came in; it may change later
                answers[i] = _ask(session, docs[i])

        start = time.perf_counter()
        with ThreadPoolExecutor(len(docs)) as workers:
            for f in [workers.submit(job, i) for i in range(len(docs))]:
                f.result()
        return answers, time.perf_counter() - start, shares


# ---------------------------------------------------------------- run


def run(
    cfg: ConcurrencyConfig,
    engine: Engine,
    out_dir: Path,
    step: Callable[[str], None],
    command: str,
) -> dict[str, Any]:
    records = Records(out_dir / "concurrency.json", command, cfg, engine.model_name)

    def emit(record: dict[str, Any]) -> None:
        step(
            " ".join(
                f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                for k, v in record.items()
                if not isinstance(v, (list, dict))
            )
        )
        records.emit(record)

    if "server" in cfg.parts:
        server_part(engine, cfg, emit)
    if "summarize" in cfg.parts:
        summarize_part(engine, cfg, out_dir, emit)
    if "needles" in cfg.parts:
        needles_part(engine, cfg, emit)
    return records.result
