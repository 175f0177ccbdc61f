"""A pool's figures as one dict: what ``/metrics`` shows (serve/metrics.py) and the
concurrency benchmark records (bench/concurrency.py). Sizes in cells, memory in
bytes, times in seconds."""

from __future__ import annotations

import time
from collections.abc import Iterable

from ..native.context import NativeContext
from ..native.kvmemory import KVLayout
from .scheduler import Scheduler
from .shares import ShareRule
from .slot import Slot


def sequence(slot: Slot, cells: int, now: float) -> dict[str, object]:
    """One running sequence in a pool of ``cells`` cells (``now``: ``time.time()``)."""
    st = slot.stats
    return {
        "seq": slot.seq,
        "label": slot.label,
        "share_cells": slot.n_ctx,
        "share": slot.n_ctx / cells,
        "policy": st.policy if st else None,
        "budget_tokens": st.budget_tokens if st else None,
        "cells_used": st.cells_used if st else 0,
        "tokens_seen": st.tokens_seen if st else 0,
        "evicted_tokens": st.evicted_tokens if st else 0,
        "evictions": st.evictions if st else 0,
        "retention": (st.cells_used / st.tokens_seen) if st and st.tokens_seen else 1.0,
        "seconds": now - slot.started,
    }


def snapshot(
    *,
    rule: ShareRule,
    max_seqs: int,
    ctx: NativeContext,
    kv_layout: KVLayout,
    slots: Iterable[Slot],
    peak_seqs: int,
    scheduler: Scheduler,
) -> dict[str, object]:
    """The pool (its ``rule``, context and ``kv_layout``; the scheduler's counts) and
    each running sequence of ``slots``, by id; ``kept``: sequences kept idle with the
    text they read for a next request (``Slot.kept``, serve/runner.py)."""
    now = time.time()
    held = sorted(slots, key=lambda s: s.seq)
    running = [s for s in held if not s.kept]
    seqs = [sequence(s, rule.cells, now) for s in running]
    steps, tokens = scheduler.steps, scheduler.tokens
    return {
        "cells": rule.cells,
        "n_ctx": ctx.n_ctx,
        "max_seqs": max_seqs,
        "share_rule": rule.share,
        "layout": rule.layout,
        "reserved_cells": sum(s.n_ctx for s in held),
        "active": len(seqs),
        "kept": len(held) - len(running),
        "peak_seqs": peak_seqs,
        "peak_cells": scheduler.peak_cells,
        "steps": steps,
        "tokens": tokens,
        "mean_batch_tokens": tokens / steps if steps else 0.0,
        "decode_s": scheduler.decode_s,
        "owed_s": scheduler.owed_s,
        "kv_bytes": ctx.n_ctx * kv_layout.global_cell_bytes
        + ctx.swa_cells * kv_layout.swa_cell_bytes,
        "sequences": seqs,
    }
