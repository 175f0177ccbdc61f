"""The GPU check's measurements (scripts/gpu/check.sh): memory and speed of long
documents with llama.cpp's own defaults and with kvtrim, one process per run.

Each run is a fresh process, so NVML's figure for it is that run alone: model
weights, KV cache, compute buffers and the CUDA context, sampled every 50 ms by the
same monitor the app's graph uses (``MemoryRecorder``). llama.cpp's own buffer
sizes (its "model/KV/compute buffer size" log lines) split that figure. Runs:

- ``default``: plain llama.cpp as llama-server runs it (flash attention on, a
  sliding-window cache of window size where the model has one, f16 KV, batch
  2,048, micro-batch 512), a cache for the whole document;
- ``noflash``: the same without flash attention: the KQ matrix of a micro-batch
  against the whole cache is a compute buffer (VRAM too). Past ``speed_max``
  tokens only its memory is measured (the context is made and one batch read);
- ``<policy>-<budget>``: kvtrim at that budget (SnapKV reads attention, so flash
  attention is off for it; StreamingLLM reads none and runs with it on).

Units: bytes, seconds, tokens per second. Document lengths are in the model's
tokens. Quality is not measured here: synthetic weights answer nothing.

``--alloc`` needs no GPU: each configuration's context is created and nothing is
read, and llama.cpp's own buffer sizes are recorded. The KV buffer is the same
bytes on any backend; compute buffers are the CPU backend's (CUDA's differ).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llama_cpp import Llama

from ..native.cpu import reference_llama, system_info
from ..native.monitor import MemoryMonitor, MemoryRecorder, MemorySample
from ..runtime.engine import Engine
from ..session.core import Session
from ..session.prompts import Prompt
from .reference import decode_greedy
from .tasks import filler_haystack

_BUFFER = re.compile(r"(\S+)\s+(model|KV|compute|output|RS) buffer size =\s+([\d.]+) MiB")
_FLASH = re.compile(r"Flash Attention (enabled|disabled)", re.IGNORECASE)
_MiB = 2**20
FRAME = 128  # tokens beside the document and the answer: the prompt's frame is under 64
PREFIX, SUFFIX = "Read the document.\n\n", "\n\nWhat is it about? It is about"


@dataclass(frozen=True)
class Run:
    """One measurement: a model, a document length and a configuration."""

    model: str  # GGUF path
    label: str  # the model's name in tables
    config: str  # "default", "noflash" or "<policy>-<budget>"
    length: int  # document tokens
    gpu_layers: int = 99
    decode_tokens: int = 32
    speed_max: int = 1 << 30  # noflash past this many tokens: memory only


class _BufferLog(logging.Handler):
    """llama.cpp's buffer-size lines, summed by (device, kind), and whether it
    turned flash attention on ("auto" is resolved when the context is made)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.sizes: dict[str, float] = {}
        self.flash: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        m = _BUFFER.search(text)
        if m:
            key = f"{m.group(1)} {m.group(2)}"
            self.sizes[key] = self.sizes.get(key, 0.0) + float(m.group(3)) * _MiB
        f = _FLASH.search(text)
        if f:
            self.flash = f.group(1).lower()


def document_tokens(tokenize: Callable[[str], list[int]], length: int) -> list[int]:
    """``length`` tokens of filler text (llama.cpp's passkey document)."""
    return tokenize(filler_haystack(int(length * 1.2) + 64, 0.5, 12345))[:length]


def _trace(samples: list[MemorySample]) -> list[tuple[float, float]]:
    """(seconds, MiB) of this process's GPU memory (its RSS without a GPU), at most
    400 points."""
    step = max(1, len(samples) // 400)
    out = []
    for s in samples[::step]:
        b = s.process_gpu_bytes if s.process_gpu_bytes is not None else s.rss_bytes
        out.append((round(s.t, 3), round(b / _MiB, 1)))
    return out


def _llama_default(run: Run, flash: bool) -> Llama:
    """llama.cpp as llama-server runs it (see the module doc), sized for ``run``."""
    return reference_llama(
        run.model,
        n_ctx=run.length + run.decode_tokens + FRAME,
        n_batch=2048,
        n_ubatch=512,
        n_gpu_layers=run.gpu_layers,
        flash_attn=flash,
        swa_full=False,
        verbose=False,
    )


def _plain(run: Run, flash: bool) -> dict[str, Any]:
    """llama.cpp alone: prefill the document, decode greedily."""
    memory_only = not flash and run.length > run.speed_max
    llm = _llama_default(run, flash)
    try:

        def tokenize(text: str) -> list[int]:
            return llm.tokenize(text.encode(), add_bos=False, special=False)

        doc = document_tokens(tokenize, run.length)
        tokens = [llm.token_bos(), *tokenize(PREFIX), *doc, *tokenize(SUFFIX)]
        start = time.perf_counter()
        llm.eval(tokens[:512] if memory_only else tokens)
        prefill_s = time.perf_counter() - start
        if memory_only:
            return {"prompt_tokens": len(tokens), "memory_only": True, "flash_attn": False}
        decode_s = decode_greedy(llm, run.decode_tokens)
    finally:
        llm.close()
    return {
        "prompt_tokens": len(tokens),
        "prefill_tokens_per_s": len(tokens) / prefill_s,
        "decode_tokens_per_s": run.decode_tokens / decode_s,
        "flash_attn": flash,
    }


def _kvtrim(run: Run) -> dict[str, Any]:
    policy, budget = run.config.rsplit("-", 1)
    with Engine(run.model, n_gpu_layers=run.gpu_layers) as engine:
        model = engine.model
        doc = model.detokenize(document_tokens(model.tokenize, run.length))
        with engine.session(policy, int(budget)) as session:
            prompt = Prompt(PREFIX, doc, SUFFIX, (), model.add_bos)
            result = Session.collect(session.run(prompt, max_tokens=run.decode_tokens))
            s = result.stats
            reads = session.policy.needs().attention
            flash = "off" if reads else session.config.flash_attn  # auto: llama.cpp's choice
    busy = s.prefill_s + s.decode_s
    return {
        "prompt_tokens": s.prompt_tokens,
        "prefill_tokens_per_s": s.prefill_tokens_per_s,
        "decode_tokens_per_s": s.decode_tokens_per_s,
        "flash_attn": flash,
        "kv_bytes": s.kv_bytes,
        "kv_bytes_llama_default": s.kv_bytes_llama_default,
        "kv_cells_peak": s.cells_peak,
        "evicted_tokens": s.evicted_tokens,
        "capture_s": s.capture_s,
        "score_s": s.score_s,
        "capture_share": (s.capture_s / busy if busy else 0.0) if reads else None,
    }


def _buffer_log() -> _BufferLog:
    """Collects llama.cpp's INFO lines; its warnings and errors (a failed
    allocation, say) still reach stderr, which the parent keeps."""
    log = logging.getLogger("kvtrim.llama")
    buffers = _BufferLog()
    log.addHandler(buffers)
    warnings = logging.StreamHandler(sys.stderr)
    warnings.setLevel(logging.WARNING)
    log.addHandler(warnings)
    log.setLevel(logging.INFO)
    log.propagate = False
    return buffers


def allocation(run: Run) -> dict[str, Any]:
    """llama.cpp's buffers for ``run`` when its context is made; nothing is read."""
    buffers = _buffer_log()
    if run.config in ("default", "noflash"):
        _llama_default(run, flash=run.config == "default").close()
    else:
        policy, budget = run.config.rsplit("-", 1)
        with (
            Engine(run.model, n_gpu_layers=run.gpu_layers) as engine,
            engine.session(policy, int(budget)) as session,
        ):
            session.prepare(run.length + run.decode_tokens + FRAME)
    sizes = {k: round(v) for k, v in sorted(buffers.sizes.items())}
    logging.getLogger("kvtrim.llama").removeHandler(buffers)
    return {**asdict(run), "alloc_only": True, "llama_buffers": sizes}


def measure(run: Run) -> dict[str, Any]:
    """One run in this process: its figures and memory trace."""
    buffers = _buffer_log()
    start = time.perf_counter()
    with MemoryRecorder(0.05, MemoryMonitor()) as rec:
        if run.config in ("default", "noflash"):
            figures = _plain(run, flash=run.config == "default")
        else:
            figures = _kvtrim(run)
    mon = rec.monitor
    return {
        **asdict(run),
        **figures,
        "flash_resolved": buffers.flash,  # what llama.cpp chose for the last context made
        "wall_s": time.perf_counter() - start,
        "gpu": rec.samples[0].gpus[0].name if rec.samples[0].gpus else None,
        "gpu_note": mon.gpu_note,
        "process_gpu_peak_bytes": mon.process_gpu_peak_bytes if mon.has_gpu else None,
        "device_peak_bytes": mon.gpu_peak_bytes if mon.has_gpu else None,
        "rss_peak_bytes": mon.rss_peak_bytes,
        "llama_buffers": {k: round(v) for k, v in sorted(buffers.sizes.items())},
        "trace": _trace(rec.samples),
    }


@dataclass
class Plan:
    models: dict[str, str]  # label: GGUF path
    lengths: list[int]
    budgets: list[int]
    policies: list[str] = field(default_factory=lambda: ["snapkv", "streaming"])
    gpu_layers: int = 99
    decode_tokens: int = 32
    speed_max: int = 32768
    deadline_s: float = 420.0

    def runs(self) -> list[Run]:
        """Every model, length and configuration, most wanted first, so that a
        deadline cuts the least wanted: llama.cpp's default at every length (what
        fits a card), kvtrim at the smallest budget on the longest document, no
        flash attention, kvtrim's other budgets on the longest document, then
        kvtrim on shorter documents (its memory does not depend on the length)."""
        configs = ["default", "noflash"]
        configs += [f"{p}-{b}" for b in self.budgets for p in self.policies]
        runs = [
            Run(path, label, config, length, self.gpu_layers, self.decode_tokens, self.speed_max)
            for length in self.lengths
            for label, path in self.models.items()
            for config in configs
        ]
        models = list(self.models)
        longest, smallest = max(self.lengths), min(self.budgets)

        def priority(run: Run) -> tuple[int, int, int]:
            if run.config in ("default", "noflash"):
                tier = 0 if run.config == "default" else 2
            elif run.length == longest:
                tier = 1 if run.config.endswith(f"-{smallest}") else 3
            else:
                return (4, -run.length, models.index(run.label))
            return (tier, run.length, models.index(run.label))

        return sorted(runs, key=priority)  # stable: policies keep their order


def run_limit_s(run: Run) -> float:
    """The most one run may take (a hang or a slow capture does not eat the rest):
    loading and 2,000 tokens a second of document at least."""
    return 60 + run.length / 2000


def run_all(plan: Plan, out: Path, log: Any = print, alloc: bool = False) -> list[dict[str, Any]]:
    """Every run in its own process, results to ``out/gpu.json`` as they come and
    each child's stderr to ``out/runs.log``; a run that would start past the
    deadline, or fails, is recorded as such and the others go on."""
    out.mkdir(parents=True, exist_ok=True)
    stderr_log = out / "runs.log"
    stderr_log.write_text("")
    start = time.perf_counter()
    records: list[dict[str, Any]] = []
    meta = {"llama_cpp": system_info(), "plan": asdict(plan), "command": " ".join(sys.argv)}
    for run in plan.runs():
        left = plan.deadline_s - (time.perf_counter() - start)
        if left < 5:
            records.append({**asdict(run), "skipped": "deadline"})
            continue
        t0 = time.perf_counter()
        args = [sys.executable, "-m", "engine.bench.gpu", "--one", json.dumps(asdict(run))]
        args += ["--alloc"] if alloc else []
        limit = min(left, run_limit_s(run))
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=limit)
            with stderr_log.open("a") as f:
                f.write(f"== {run.label} {run.length} {run.config}: exit {done.returncode}\n")
                f.write(done.stderr)
            lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
            if done.returncode != 0 or not lines:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                record = {**asdict(run), "error": f"exit {done.returncode}: {' / '.join(tail)}"}
            else:
                record = json.loads(lines[-1])
        except subprocess.TimeoutExpired:
            record = {**asdict(run), "error": f"stopped after {limit:.0f} s"}
        except Exception as exc:  # one bad run must not lose the others
            record = {**asdict(run), "error": f"{type(exc).__name__}: {exc}"}
        if "error" in record:  # it goes into a Markdown table cell
            record["error"] = str(record["error"]).replace("|", "/")
        records.append(record)
        log(_line(record, time.perf_counter() - t0))
        name = "alloc.json" if alloc else "gpu.json"
        (out / name).write_text(json.dumps({**meta, "runs": records}, indent=1))
    return records


def _line(r: dict[str, Any], secs: float) -> str:
    what = f"{r['label']} {r['length']:>7,} tokens {r['config']:<16}"
    if "error" in r or "skipped" in r:
        return f"{what} {r.get('error') or 'skipped: ' + r['skipped']}"
    if r.get("alloc_only"):
        return f"{what} {r['llama_buffers']}  ({secs:.0f} s)"
    peak = r["process_gpu_peak_bytes"]
    if peak is not None:
        mem = f"GPU {peak / 2**30:6.2f} GiB"
    else:
        mem = f"RSS {r['rss_peak_bytes'] / 2**30:.2f} GiB"
    speed = (
        f"prefill {r['prefill_tokens_per_s']:8.0f} tok/s, decode {r['decode_tokens_per_s']:6.1f}"
        if "prefill_tokens_per_s" in r
        else "memory only"
    )
    return f"{what} {mem}  {speed}  ({secs:.0f} s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.bench.gpu", description=__doc__)
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child: one Run as JSON
    p.add_argument("--model", action="append", default=[], metavar="LABEL=PATH")
    p.add_argument("--lengths", default="8192,32768,131072")
    p.add_argument("--budgets", default="1024,4096")
    p.add_argument("--policies", default="snapkv,streaming")
    p.add_argument("--gpu-layers", type=int, default=99)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--speed-max", type=int, default=32768, help="noflash past this: memory only")
    p.add_argument("--deadline", type=float, default=420.0, help="seconds for all runs")
    p.add_argument("--out", type=Path, default=Path("bench-out/gpu"))
    p.add_argument("--alloc", action="store_true", help="buffers only, nothing read, no GPU")
    a = p.parse_args(argv)
    if a.one:
        run = Run(**json.loads(a.one))
        print(json.dumps(allocation(run) if a.alloc else measure(run)), flush=True)
        return 0
    if not a.model:
        p.error("give at least one --model LABEL=PATH")
    plan = Plan(
        models=dict(m.split("=", 1) for m in a.model),
        lengths=[int(x) for x in a.lengths.split(",")],
        budgets=[int(x) for x in a.budgets.split(",")],
        policies=a.policies.split(","),
        gpu_layers=a.gpu_layers,
        decode_tokens=a.decode_tokens,
        speed_max=a.speed_max,
        deadline_s=a.deadline,
    )
    records = run_all(plan, a.out, log=lambda line: print(line, flush=True), alloc=a.alloc)
    from .gpu_report import alloc_table, write_report

    if a.alloc:
        (a.out / "alloc.md").write_text(alloc_table(records) + "\n")
        print(alloc_table(records))
        return 0 if any("alloc_only" in r for r in records) else 1
    write_report(records, a.out)
    return 0 if any("prefill_tokens_per_s" in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
