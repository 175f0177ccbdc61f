"""``kvtrim --self-test``: does this install (or bundle) work on this machine?

Loads the default model (or ``--model``, with ``--gpu-layers`` on the GPU), reads
a 2,000-token passkey document in a 256-token SnapKV cache (so eviction runs),
answers and prints the figures, llama.cpp's build line and the GPU memory this
process holds (``kvtrim --self-test`` adds a check of the app's Qt libraries
unless ``--no-gui``). Exit code 0 when the machinery works; whether the model
finds the key is reported, not required.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TextIO

from ..bench.tasks import PASSKEY_PREFIX, PASSKEY_SUFFIX, filler_haystack
from ..native.cpu import gpu_backends, system_info
from ..native.monitor import MemoryMonitor
from ..runtime.engine import Engine
from ..session.core import Session
from ..session.prompts import Prompt

KEY = 68142
_MB = 2**20


def _engine_check(out: TextIO, model: Path | None, gpu_layers: int) -> bool:
    monitor = MemoryMonitor()
    start = time.perf_counter()
    with (
        Engine(model, n_gpu_layers=gpu_layers) as engine,
        engine.session("snapkv", 256) as session,
    ):
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
        out.write(f"llama.cpp: {system_info()}\n")
        out.write(_gpu_line(monitor, engine.model.n_gpu_layers, engine.model.gpu_offload))
        monitor.close()
        for note in engine.notes:
            out.write(f"note: {note}\n")
        return s.generated_tokens > 0 and s.evicted_tokens > 0 and s.cells_peak <= s.n_ctx


def _gpu_line(monitor: MemoryMonitor, gpu_layers: int, offload: bool) -> str:
    sample = monitor.sample()
    backends = gpu_backends(system_info())
    if offload:
        build = "a GPU build"
    elif backends:
        build = f"a {'/'.join(backends)} build that found no usable GPU"
    else:
        build = "a CPU-only build"
    if not sample.gpus:
        return f"GPU: none ({sample.gpu_note}); {build}, {gpu_layers} GPU layers asked for\n"
    gpu = sample.gpus[0]
    mine = sample.process_gpu_bytes or 0
    return (
        f"GPU: {gpu.name}, {gpu.used_bytes / _MB:,.0f} of {gpu.total_bytes / _MB:,.0f} MB "
        f"used, this process {mine / _MB:,.0f} MB; {build}, {gpu_layers} GPU layers "
        "asked for\n"
    )


def main(out: TextIO | None = None, *, model: Path | None = None, gpu_layers: int = 0) -> int:
    out = out or sys.stdout
    try:
        ok = _engine_check(out, model, gpu_layers)
    except Exception as exc:  # report anything: this is the first thing a user runs
        out.write(f"self-test failed: {type(exc).__name__}: {exc}\n")
        return 1
    if not ok:
        out.write("self-test failed: the session did not evict or generate\n")
    return 0 if ok else 1
