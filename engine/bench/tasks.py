"""Benchmark tasks: one function per measurement, each returning a flat record.

Every record carries the run's memory and speed figures next to its quality
figure, so one table can compare them (units in the key names).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..native.monitor import MemoryMonitor
from ..policies import evicts
from ..runtime.engine import Engine
from ..session.prompts import Prompt, summary_prompt
from ..stats import Done, Event, KVStats
from . import texts

FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
PASSKEY_PREFIX = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize them. I will quiz you about the important information there."
)
PASSKEY_SUFFIX = " What is the pass key? The pass key is"
_FILLER_TOKENS = 24  # tokens per filler sentence group with the default model


def key_for(seed: int, depth: float, trial: int) -> int:
    return random.Random(f"{seed}-{depth:.3f}-{trial}").randint(10000, 99999)


def _key_line(key: int) -> str:
    return f"The pass key is {key}. Remember it. {key} is the pass key. "


def passkey_haystack(n_groups: int, depth: float, key: int) -> str:
    """llama.cpp's passkey document: ``n_groups`` filler groups, the key line at ``depth``."""
    at = int(n_groups * depth)
    return FILLER * at + _key_line(key) + FILLER * (n_groups - at)


def filler_haystack(length: int, depth: float, key: int) -> str:
    """llama.cpp's passkey document of about ``length`` tokens."""
    return passkey_haystack(max(2, (length - 60) // _FILLER_TOKENS), depth, key)


def real_haystack(engine: Engine, length: int, depth: float, key: int, offset: int) -> str:
    """A real-text passage of about ``length`` tokens with the key line at ``depth``,
    inserted at a paragraph or sentence boundary."""
    text = real_text(engine, length - 40, offset)
    cut = int(len(text) * depth)
    boundary = max(text.rfind("\n\n", 0, cut), text.rfind(". ", 0, cut))
    at = boundary + 2 if boundary > 0 else cut
    return text[:at] + _key_line(key) + text[at:]


def real_text(engine: Engine, n_tokens: int, offset: int) -> str:
    """Exactly ``n_tokens`` tokens of the real corpus, as text."""
    chunk = texts.window(offset, n_tokens * 8)
    tokens = engine.model.tokenize(chunk)[:n_tokens]
    return engine.model.detokenize(tokens)


def _figures(stats: KVStats, monitor: MemoryMonitor, wall_s: float) -> dict[str, Any]:
    share = (stats.capture_s + stats.score_s) / stats.prefill_s if stats.prefill_s else 0.0
    return {
        "prompt_tokens": stats.prompt_tokens,
        "generated_tokens": stats.generated_tokens,
        "kv_cells_peak": stats.cells_peak,
        "kv_bytes_peak": stats.kv_bytes,
        "kv_bytes_llama_default": stats.kv_bytes_llama_default,
        "kv_bytes_full": stats.kv_bytes_full,
        "kv_ratio": stats.kv_ratio,
        "kv_ratio_full": stats.kv_ratio_full,
        "kv_cells_allocated": stats.n_ctx,
        "kv_swa_cells": stats.swa_cells,
        "kv_type": stats.kv_type,
        "evicted_tokens": stats.evicted_tokens,
        "prefill_tokens_per_s": stats.prefill_tokens_per_s,
        "decode_tokens_per_s": stats.decode_tokens_per_s,
        "first_token_s": stats.first_token_s,
        "capture_score_share": share,
        "rss_peak_bytes": monitor.rss_peak_bytes,
        "gpu_peak_bytes": monitor.gpu_peak_bytes if monitor.has_gpu else None,
        "wall_s": wall_s,
    }


def _drain(events: Iterator[Event], monitor: MemoryMonitor) -> Done:
    done = None
    for event in events:
        monitor.sample()
        if isinstance(event, Done):
            done = event
    assert done is not None
    return done


def _budget_for(policy: str, budget: int, length: int, extra: int = 96) -> int:
    """The full cache is the reference: a budget for the whole input plus the prompt's
    frame and the generated tokens (llama.cpp rounds caches up to 256 cells)."""
    return budget if evicts(policy) else length + extra


def passkey(
    engine: Engine,
    policy: str,
    budget: int,
    length: int,
    depth: float,
    key: int,
    haystack: str,
    offset: int = 0,
    max_tokens: int = 8,
    **session: Any,
) -> dict[str, Any]:
    """Pass key retrieval: is the key in the greedy answer? ``session``: more
    ``Engine.session`` settings (``swa_cache``, ``kv_type``)."""
    doc = (
        filler_haystack(length, depth, key)
        if haystack == "filler"
        else real_haystack(engine, length, depth, key, offset)
    )
    prompt = Prompt(PASSKEY_PREFIX, doc, PASSKEY_SUFFIX, (), True)
    monitor = MemoryMonitor()
    start = time.perf_counter()
    size = _budget_for(policy, budget, length, 96 + max_tokens)
    with engine.session(policy, size, **session) as s:
        done = _drain(s.run(prompt, max_tokens=max_tokens, stops=()), monitor)
    monitor.close()
    return {
        "task": f"passkey_{haystack}",
        "depth": depth,
        "hit": str(key) in done.text,
        "answer": done.text.strip()[:40],
        **_figures(done.stats, monitor, time.perf_counter() - start),
    }


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities of each row of ``logits`` (rows, vocabulary)."""
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def continuation_logprobs(
    engine: Engine,
    policy: str,
    budget: int,
    doc: list[int],
    cont: list[int],
    flash_attn: str = "auto",
    **session: Any,
) -> tuple[np.ndarray, KVStats, float]:
    """Teacher-forced log-probabilities over ``cont`` after reading ``doc``."""
    blocks = []
    start = time.perf_counter()
    size = _budget_for(policy, budget, len(doc) + len(cont), 16)
    with engine.session(policy, size, flash_attn=flash_attn, **session) as s:
        for _ in s.feed(doc, logits=False):
            pass
        for block in s.teacher_force(cont):
            blocks.append(log_softmax(block))
        stats = s.stats
    return np.concatenate(blocks), stats, time.perf_counter() - start


def fidelity(
    engine: Engine,
    policy: str,
    budget: int,
    doc: list[int],
    cont: list[int],
    reference: np.ndarray,
    **session: Any,
) -> dict[str, Any]:
    """Mean KL(full || policy) of the next-token distribution, and top-1 agreement,
    teacher-forced over ``cont`` (units: nats; fraction)."""
    monitor = MemoryMonitor()
    logp, stats, wall = continuation_logprobs(engine, policy, budget, doc, cont, **session)
    monitor.sample()
    monitor.close()
    p_ref = np.exp(reference)
    kl = (p_ref * (reference - logp)).sum(axis=1)
    top1 = (reference.argmax(axis=1) == logp.argmax(axis=1)).mean()
    return {
        "task": "fidelity",
        "kl_mean": float(kl.mean()),
        "top1_agreement": float(top1),
        "continuation_tokens": len(cont),
        **_figures(stats, monitor, wall),
    }


def summary(
    engine: Engine,
    policy: str,
    budget: int,
    length: int,
    doc: str,
    max_tokens: int,
    flash_attn: str = "auto",
) -> tuple[str, dict[str, Any]]:
    """A greedy summary of ``doc``; the caller scores it against the full cache's."""
    monitor = MemoryMonitor()
    start = time.perf_counter()
    size = _budget_for(policy, budget, length, 96 + max_tokens)
    with engine.session(policy, size, flash_attn=flash_attn) as s:
        done = _drain(
            s.run(summary_prompt(engine.model, doc), max_tokens=max_tokens, stops=()), monitor
        )
    monitor.close()
    record = {"task": "summary", **_figures(done.stats, monitor, time.perf_counter() - start)}
    return done.text.strip(), record
