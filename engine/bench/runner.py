"""``kvtrim bench``: policies side by side on quality, memory and speed.

Two experiments from one model load:
- quality: at one document length, each policy x budget on passkey retrieval
  (filler and real-text haystacks), fidelity to the full cache (teacher-forced
  KL and top-1 agreement) and summary agreement (ROUGE-L against the full cache);
- scaling: at one budget, each policy x document length on KV memory and speed,
  with plain llama-cpp-python (flash attention on and off) as the reference.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..policies import POLICIES, Full, evicts
from ..runtime.engine import Engine
from ..session.core import default_threads
from . import maps, tasks, texts
from .reference import plain_llama


@dataclass
class BenchConfig:
    """What to run; budgets may be fractions of ``length`` ("1/8") or cell counts."""

    policies: list[str] = field(default_factory=lambda: list(POLICIES))
    length: int = 2048
    budgets: list[str] = field(default_factory=lambda: ["1/8", "1/4"])
    depths: int = 4
    trials: int = 1
    continuation: int = 256
    summary_tokens: int = 48
    lengths: list[int] = field(default_factory=lambda: [2048, 4096, 8192, 16000])
    scale_budget: int = 1024
    decode_tokens: int = 32
    seed: int = 0
    model: str | None = None
    threads: int | None = None

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(
            policies=["full", "streaming", "snapkv"],
            length=1024,
            budgets=["1/4"],
            depths=2,
            continuation=64,
            summary_tokens=16,
            lengths=[512, 1024],
            scale_budget=256,
            decode_tokens=8,
        )

    def budget_cells(self) -> list[int]:
        out = []
        for b in self.budgets:
            if "/" in b:
                num, den = b.split("/")
                out.append(self.length * int(num) // int(den))
            else:
                out.append(int(b))
        return out

    def depth_list(self) -> list[float]:
        return [round((i + 0.5) / self.depths, 3) for i in range(self.depths)]


Progress = Callable[[str], None]


def _passkeys(
    engine: Engine,
    cfg: BenchConfig,
    base: dict[str, Any],
    emit: Callable[[dict[str, Any]], None],
    step: Progress,
) -> None:
    """The passkey runs of the policy and budget ``base`` names (the fields every
    record of them starts with): every trial, depth and haystack."""
    policy, budget = base["policy"], base["budget_tokens"]
    for trial in range(cfg.trials):
        for depth in cfg.depth_list():
            key = tasks.key_for(cfg.seed, depth, trial)
            for haystack in ("filler", "real"):
                step(f"{policy} budget={budget} passkey {haystack} depth={depth}")
                emit(
                    {
                        **base,
                        "trial": trial,
                        **tasks.passkey(
                            engine,
                            policy,
                            budget,
                            cfg.length,
                            depth,
                            key,
                            haystack,
                            offset=(trial * 50_000 + int(depth * 1000)) * 3,
                        ),
                    }
                )


def _fidelity_tokens(engine: Engine, cfg: BenchConfig) -> tuple[list[int], list[int]]:
    """The fidelity document (with BOS) and the real text that continues it, as tokens."""
    model = engine.model
    fid_doc_text = tasks.real_text(engine, cfg.length, 40_000 + cfg.seed * 7919)
    fid_doc = model.tokenize(fid_doc_text, add_bos=True)
    fid_cont = model.tokenize(
        tasks.real_text(engine, cfg.continuation + 8, 40_000 + cfg.seed * 7919 + len(fid_doc_text))
    )
    return fid_doc, fid_cont[: cfg.continuation]


def _quality(
    engine: Engine, cfg: BenchConfig, emit: Callable[[dict[str, Any]], None], step: Progress
) -> None:
    """Each policy and budget at ``cfg.length``: the passkeys, fidelity to the full
    cache (KL, top-1) and the summary's ROUGE-L against the full cache's."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    fid_doc, fid_cont = _fidelity_tokens(engine, cfg)
    summary_doc = tasks.real_text(engine, cfg.length, 200_000 + cfg.seed * 7919)
    # the reference is the full cache in the same numeric mode as the policy: policies
    # that read attention run without flash attention, which alone moves greedy tokens
    reference_logp: dict[str, Any] = {}
    reference_summary: dict[str, str] = {}
    for policy in cfg.policies:
        mode = "off" if POLICIES[policy].needs().attention else "auto"
        budgets = cfg.budget_cells() if evicts(policy) else [cfg.length]
        for budget in budgets:
            base = {
                "experiment": "quality",
                "policy": policy,
                "budget_tokens": budget,
                "length": cfg.length,
            }
            _passkeys(engine, cfg, base, emit, step)
            step(f"{policy} budget={budget} fidelity")
            if mode not in reference_logp:
                reference_logp[mode], _, _ = tasks.continuation_logprobs(
                    engine, Full.name, 0, fid_doc, fid_cont, flash_attn=mode
                )
            emit(
                {
                    **base,
                    "reference_flash_attn": mode,
                    **tasks.fidelity(
                        engine, policy, budget, fid_doc, fid_cont, reference_logp[mode]
                    ),
                }
            )
            step(f"{policy} budget={budget} summary")
            if mode not in reference_summary:
                reference_summary[mode], _ = tasks.summary(
                    engine, Full.name, 0, cfg.length, summary_doc, cfg.summary_tokens, mode
                )
            text, record = tasks.summary(
                engine, policy, budget, cfg.length, summary_doc, cfg.summary_tokens
            )
            rouge = scorer.score(reference_summary[mode], text)["rougeL"].fmeasure
            emit({**base, **record, "rouge_l": rouge, "summary": text[:300]})


def _scaling(
    engine: Engine, cfg: BenchConfig, emit: Callable[[dict[str, Any]], None], step: Progress
) -> None:
    for length in cfg.lengths:
        key = tasks.key_for(cfg.seed, 0.5, 99)
        for policy in cfg.policies:
            step(f"{policy} length={length}")
            rec = tasks.passkey(
                engine,
                policy,
                cfg.scale_budget,
                length,
                0.5,
                key,
                "filler",
                max_tokens=cfg.decode_tokens,
            )
            emit(
                {
                    "experiment": "scaling",
                    "policy": policy,
                    "budget_tokens": cfg.scale_budget if evicts(policy) else length,
                    "length": length,
                    **rec,
                }
            )
        doc = tasks.filler_haystack(length, 0.5, key)
        tokens = engine.model.tokenize(
            tasks.PASSKEY_PREFIX + doc + tasks.PASSKEY_SUFFIX, add_bos=True
        )
        for flash in (True, False):
            name = f"llama-cpp-python (flash attn {'on' if flash else 'off'})"
            step(f"{name} length={length}")
            emit(
                {
                    "experiment": "scaling",
                    "policy": name,
                    "budget_tokens": len(tokens),
                    "length": length,
                    **plain_llama(
                        engine.model.info.path,
                        tokens,
                        cfg.decode_tokens,
                        flash,
                        cfg.threads or default_threads(),
                    ),
                }
            )


def steps_total(cfg: BenchConfig) -> int:
    n_budget_rows = sum(len(cfg.budget_cells()) if evicts(p) else 1 for p in cfg.policies)
    quality = n_budget_rows * (cfg.trials * cfg.depths * 2 + 2)
    return quality + len(cfg.lengths) * (len(cfg.policies) + 2) + 1


def machine() -> dict[str, Any]:
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": psutil.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "system": platform.platform(),
    }


def run(cfg: BenchConfig, out_dir: Path, step: Progress, command: str = "") -> dict[str, Any]:
    """Run both experiments; write ``results.json``; return it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    start = time.perf_counter()
    with Engine(cfg.model, n_threads=cfg.threads) as engine:
        info = engine.model.info
        _quality(engine, cfg, records.append, step)
        _scaling(engine, cfg, records.append, step)
        needle = run_maps(engine, cfg, step)
    result = {
        "command": command,
        "config": asdict(cfg),
        "model": {
            "name": info.name,
            "path": info.path,
            "arch": info.arch,
            "kv_bytes_per_cell": info.kv_bytes_per_cell(),
        },
        "machine": machine(),
        "text_source": texts.SOURCE,
        "elapsed_s": time.perf_counter() - start,
        "records": records,
        "maps": needle,
    }
    (out_dir / "results.json").write_text(json.dumps(result, indent=1))
    return result


def run_maps(engine: Engine, cfg: BenchConfig, step: Progress) -> list[dict[str, Any]]:
    """One needle run per policy at the smallest budget, with its memory map."""
    out = maps.needle_maps(engine, cfg.policies, cfg.length, min(cfg.budget_cells()))
    step(f"memory maps of {len(out)} needle runs")
    return out
