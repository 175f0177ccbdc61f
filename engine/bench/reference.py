"""The same model with no eviction machinery: plain llama-cpp-python, as the
speed reference (flash attention on and off)."""

from __future__ import annotations

import time
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama

from ..native.cpu import reference_llama
from ..native.monitor import MemoryMonitor


def decode_greedy(llm: Llama, n_tokens: int) -> float:
    """Decode ``n_tokens`` greedily after what ``llm`` has read; seconds taken."""
    start = time.perf_counter()
    for _ in range(n_tokens):
        last = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        llm.eval([int(np.argmax(np.ctypeslib.as_array(last, shape=(llm.n_vocab(),))))])
    return time.perf_counter() - start


def plain_llama(
    model_path: str,
    tokens: list[int],
    decode_tokens: int,
    flash: bool,
    n_threads: int | None = None,
) -> dict[str, Any]:
    """Prefill ``tokens`` then decode greedily; tokens/s for each phase."""
    monitor = MemoryMonitor()
    llm = reference_llama(
        model_path,
        n_ctx=len(tokens) + decode_tokens + 64,
        n_batch=512,
        flash_attn=flash,
        n_threads=n_threads,
        verbose=False,
    )
    try:
        start = time.perf_counter()
        llm.eval(tokens)
        prefill_s = time.perf_counter() - start
        monitor.sample()
        decode_s = decode_greedy(llm, decode_tokens)
        monitor.sample()
    finally:
        llm.close()
        monitor.close()
    return {
        "task": "reference",
        "prompt_tokens": len(tokens),
        "generated_tokens": decode_tokens,
        "prefill_tokens_per_s": len(tokens) / prefill_s,
        "decode_tokens_per_s": decode_tokens / decode_s,
        "first_token_s": prefill_s,
        "rss_peak_bytes": monitor.rss_peak_bytes,
    }
