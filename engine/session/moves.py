"""A lone session's moves between llama.cpp contexts. llama.cpp cannot resize a cache
in place, nor change a live context's eval callback or flash attention, so the
sequence moves into a new context: its cells keep their order (``KVCache.rebind``).
Sizes in tokens (= KV cells)."""

from __future__ import annotations

from typing import Any, Protocol

from ..kv.cache import KVCache
from ..native.kvmemory import CacheSettings, pad
from ..policies import Needs
from ..stats import KVStats
from .sizing import OwnContext


class Reader(Protocol):
    """What a move reads and replaces of ``reader.Reader``."""

    ctx: Any  # a NativeContext: resized, save_seq, load_seq
    cache: KVCache
    sizing: OwnContext
    needs: Needs
    stats: KVStats

    @property
    def capturing(self) -> bool: ...


def flash_of(ctx: object) -> bool | None:
    """The flash attention option ``ctx`` was made with (None: llama.cpp's choice)."""
    return getattr(ctx, "settings", {}).get("flash_attn")


def flash_for(settings: CacheSettings, capture: bool) -> bool | None:
    """What suits an empty cache: ``CacheSettings.flash_alone`` while the capture reads
    attention, llama.cpp's choice (the user's option) when nothing is read."""
    return settings.flash_alone() if capture else settings.flash_attn


def reserve(reader: Reader, n_more: int, *, shrink: bool = False) -> None:
    """Make the cache big enough for ``n_more`` tokens after those held, up to
    ``n_ctx_max`` (past it the policy evicts). ``shrink``: an empty cache may also
    get smaller (a new, shorter document). A pool's share does not grow."""
    if not reader.sizing.grows:
        return
    used, ctx = reader.cache.n_used, reader.ctx
    want = min(reader.sizing.n_ctx_max, max(pad(used + n_more), pad(ctx.n_batch)))
    if want > ctx.n_ctx or (shrink and want < ctx.n_ctx and not used):
        move(reader, want, reader.capturing, flash_of(ctx))


def move(reader: Reader, n_ctx: int, capture: bool, flash: bool | None) -> None:
    """The sequence into a new context of ``n_ctx`` cells, reading attention or not,
    with flash attention ``flash`` (a cache holding cells must keep its context's: the
    V cache's layout differs with it on and off)."""
    reader.cache.apply_shifts()
    new = reader.ctx.resized(n_ctx, capture=capture, flash_attn=flash)  # type: ignore[attr-defined]
    try:
        if reader.cache.n_used:
            new.load_seq(reader.ctx.save_seq())  # type: ignore[attr-defined]
    except BaseException:
        new.close()
        raise
    old, reader.ctx = reader.ctx, new
    reader.cache.rebind(new, track_cells=capture and reader.needs.cell_map)
    old.close()
    reader.stats.n_ctx = new.n_ctx
    reader.stats.swa_cells = new.swa_cells
