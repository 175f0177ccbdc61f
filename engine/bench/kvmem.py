"""KV memory against llama.cpp's own default, and what the sliding-window cache and
KV quantization cost in quality (``kvtrim bench --kv-memory``).

Four parts, each written to ``kvmem.json`` as soon as it is done:
- ``alloc``: the cache a session allocates for documents of 2K-64K tokens at each
  budget (contexts are created, nothing is decoded), beside llama.cpp's default
  and a full cache in every layer;
- ``long``: passkey (filler and real text) at those lengths, budget 1,024, read
  for real: peak KV bytes and whether the key came back whole;
- ``swa``: the sliding-window cache (``window``) against every layer at a cell per
  held token (``full``, the mode before): passkey hits and teacher-forced KL/top-1;
- ``kv_type``: q8_0 and q4_0 caches against f16, same measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..policies import Full, evicting, reads_attention
from ..runtime.engine import Engine
from . import tasks
from .records import Records

_MB = 2**20
Progress = Callable[[str], None]
PARTS = ("alloc", "long", "swa", "kv_type")


@dataclass
class KVMemConfig:
    lengths: list[int] = field(default_factory=lambda: [2048, 4096, 8192, 16384, 32768, 65536])
    budgets: list[int] = field(default_factory=lambda: [256, 512, 1024, 2048, 4096, 8192])
    long_budget: int = 1024
    long_policy: str = "snapkv"
    long_depths: list[float] = field(default_factory=lambda: [0.5])
    quality_length: int = 4096
    quality_budget: int = 1024
    depths: int = 8
    swa_policies: list[str] = field(default_factory=lambda: ["snapkv"])
    fidelity_policies: list[str] = field(default_factory=evicting)
    kv_types: list[str] = field(default_factory=lambda: ["q8_0", "q4_0"])
    kv_type_policies: list[str] = field(default_factory=lambda: ["snapkv"])
    kv_type_fidelity: list[str] = field(default_factory=lambda: ["snapkv", "streaming"])
    continuation: int = 256
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    seed: int = 0

    @classmethod
    def quick(cls) -> KVMemConfig:
        return cls(
            lengths=[1024, 2048],
            budgets=[256, 1024],
            long_budget=256,
            quality_length=1024,
            quality_budget=256,
            depths=1,
            swa_policies=["snapkv"],
            fidelity_policies=["snapkv"],
            kv_types=["q8_0"],
            kv_type_policies=["snapkv"],
            kv_type_fidelity=["snapkv"],
            continuation=32,
        )

    def depth_list(self) -> list[float]:
        return [round((i + 0.5) / self.depths, 3) for i in range(self.depths)]


def _bytes(stats: Any) -> dict[str, Any]:
    return {
        "kv_bytes": stats.kv_bytes,
        "kv_bytes_llama_default": stats.kv_bytes_llama_default,
        "kv_bytes_full": stats.kv_bytes_full,
        "kv_cells": stats.n_ctx,
        "kv_swa_cells": stats.swa_cells,
    }


def alloc(engine: Engine, cfg: KVMemConfig, emit: Callable[[dict[str, Any]], None]) -> None:
    """Allocation for every (length, budget): the session sizes its cache for the job
    (prompt frame and an 8-token answer included) exactly as ``run`` would."""
    for length in cfg.lengths:
        n = length + 104
        for budget in cfg.budgets:
            with engine.session("snapkv", budget) as s:
                s.prepare(n)
                s.stats.tokens_seen = n  # the baselines for the same tokens
                chunk_bytes = s.config.chunk() * s.reader.kv_layout.cell_bytes
                emit(
                    {
                        "part": "alloc",
                        "length": length,
                        "budget": budget,
                        "chunk_bytes": chunk_bytes,
                        **_bytes(s.stats),
                    }
                )


def long(
    engine: Engine, cfg: KVMemConfig, emit: Callable[[dict[str, Any]], None], step: Progress
) -> None:
    for length in cfg.lengths:
        for depth in cfg.long_depths:
            key = tasks.key_for(cfg.seed, depth, length)
            for haystack in ("filler", "real"):
                step(f"long {haystack} length={length} depth={depth}")
                rec = tasks.passkey(
                    engine,
                    cfg.long_policy,
                    cfg.long_budget,
                    length,
                    depth,
                    key,
                    haystack,
                    offset=length * 7 + int(depth * 1000),
                )
                emit(
                    {
                        "part": "long",
                        "policy": cfg.long_policy,
                        "budget": cfg.long_budget,
                        "length": length,
                        "key": key,
                        **rec,
                    }
                )


def _passkeys(
    engine: Engine,
    cfg: KVMemConfig,
    policy: str,
    emit: Callable[[dict[str, Any]], None],
    step: Progress,
    label: dict[str, Any],
    **session: Any,
) -> None:
    for depth in cfg.depth_list():
        key = tasks.key_for(cfg.seed, depth, 7)
        for haystack in ("filler", "real"):
            step(f"{label} {policy} passkey {haystack} depth={depth}")
            rec = tasks.passkey(
                engine,
                policy,
                cfg.quality_budget,
                cfg.quality_length,
                depth,
                key,
                haystack,
                offset=int(depth * 1000) * 3,
                **session,
            )
            emit({**label, "policy": policy, "budget": cfg.quality_budget, **rec})


def quality(
    engine: Engine, cfg: KVMemConfig, emit: Callable[[dict[str, Any]], None], step: Progress
) -> None:
    """The ``swa`` and ``kv_type`` parts (they share the fidelity reference)."""
    model = engine.model
    doc_text = tasks.real_text(engine, cfg.quality_length // 2, 40_000 + cfg.seed * 7919)
    doc = model.tokenize(doc_text, add_bos=True)
    cont = model.tokenize(tasks.real_text(engine, cfg.continuation + 8, 41_000 + len(doc_text)))
    cont = cont[: cfg.continuation]
    refs: dict[str, Any] = {}

    def reference(flash: str) -> Any:
        if flash not in refs:
            refs[flash], _, _ = tasks.continuation_logprobs(
                engine, Full.name, 0, doc, cont, flash_attn=flash, swa_cache="full"
            )
        return refs[flash]

    def fidelity(policy: str, label: dict[str, Any], **session: Any) -> None:
        step(f"{label} {policy} fidelity")
        flash = "off" if reads_attention(policy) else "auto"
        rec = tasks.fidelity(
            engine, policy, cfg.quality_budget, doc, cont, reference(flash), **session
        )
        emit({**label, "policy": policy, "budget": cfg.quality_budget, **rec})

    if "swa" in cfg.parts:
        for mode in ("window", "full"):
            label = {"part": "swa", "swa_cache": mode}
            for policy in cfg.fidelity_policies:
                fidelity(policy, label, swa_cache=mode)
            for policy in cfg.swa_policies:
                _passkeys(engine, cfg, policy, emit, step, label, swa_cache=mode)
    if "kv_type" in cfg.parts:
        for kv_type in cfg.kv_types:
            label = {"part": "kv_type", "kv_type": kv_type}
            for policy in cfg.kv_type_fidelity:
                fidelity(policy, label, kv_type=kv_type)
            for policy in cfg.kv_type_policies:
                _passkeys(engine, cfg, policy, emit, step, label, kv_type=kv_type)


def run(cfg: KVMemConfig, engine: Engine, out_dir: Path, step: Progress, command: str) -> dict:
    records = Records(out_dir / "kvmem.json", command, cfg, engine.model.info.name)
    emit = records.emit
    if "alloc" in cfg.parts:
        step("allocation grid")
        alloc(engine, cfg, emit)
    if "long" in cfg.parts:
        long(engine, cfg, emit, step)
    if "swa" in cfg.parts or "kv_type" in cfg.parts:
        quality(engine, cfg, emit, step)
    return records.result
