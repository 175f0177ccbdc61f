"""``kvtrim --self-test``: does this install (or bundle) work on this machine?

Loads the default model, reads a 2,000-token passkey document in a 256-token
SnapKV cache (so eviction runs), answers and prints the figures (``kvtrim
--self-test`` adds a check of the app's Qt libraries). Exit code 0 when the
machinery works; whether a 270M model finds the key is reported, not required.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .bench.tasks import PASSKEY_PREFIX, PASSKEY_SUFFIX, filler_haystack
from .prompts import Prompt
from .runtime import Engine
from .session import Session

KEY = 68142
_MB = 2**20


def _engine_check(out: TextIO) -> bool:
    start = time.perf_counter()
    with Engine() as engine, engine.session("snapkv", 256) as session:
        loaded = time.perf_counter() - start
        doc = filler_haystack(2000, 0.4, KEY)
        prompt = Prompt(PASSKEY_PREFIX, doc, PASSKEY_SUFFIX, (), engine.model.add_bos)
        result = Session.collect(session.run(prompt, max_tokens=8))
        s = result.stats
        out.write(
            f"model: {engine.model_name} ({engine.model.info.path}), loaded in {loaded:.1f} s\n"
            f"read {s.prompt_tokens:,} tokens with snapkv at budget 256: {s.evicted_tokens:,} "
            f"evicted, {s.cells_peak} cells at most, KV {s.kv_bytes / _MB:.1f} MB held vs "
            f"{s.kv_bytes_llama_default / _MB:.1f} MB for llama.cpp's default cache\n"
            f"prefill {s.prefill_tokens_per_s:.0f} tok/s, "
            f"decode {s.decode_tokens_per_s:.1f} tok/s\n"
            f"answer: {result.text.strip()!r} (pass key {KEY} "
            f"{'found' if str(KEY) in result.text else 'not found'})\n"
        )
        if engine.model.device_note:
            out.write(f"note: {engine.model.device_note}\n")
        return s.generated_tokens > 0 and s.evicted_tokens > 0 and s.cells_peak <= s.n_ctx


def main(out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        ok = _engine_check(out)
    except Exception as exc:  # report anything: this is the first thing a user runs
        out.write(f"self-test failed: {type(exc).__name__}: {exc}\n")
        return 1
    if not ok:
        out.write("self-test failed: the session did not evict or generate\n")
    return 0 if ok else 1
