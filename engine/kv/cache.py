"""Bookkeeping of what sequence 0 of the cache holds, and the only place that
turns "tokens to keep" into ``seq_rm`` / ``seq_shift`` calls.

Three numberings meet here. A token's *id* is its index in the stream the
session has fed (prompt and generated tokens, never reused); policies see ids,
so their state survives compaction. Its *llama position* is what RoPE sees;
ids and llama positions are equal until positions are compacted to stay inside
the trained context. Its *cell* is where llama.cpp stored it (see cells.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .cells import EMPTY, CellMap
from .context import SequenceContext

CLOSE_WORDS = True  # the punctuation closing a word is kept with it (tests/kv/test_whole_words.py)
MAX_WORD_TOKENS = 16  # a longer run (a URL, a hash, text without spaces) is cut here


def _runs(sorted_values: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers as half-open ``(start, stop)``."""
    if len(sorted_values) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_values) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(sorted_values)]))
    pairs = zip(starts, stops, strict=True)
    return [(int(sorted_values[a]), int(sorted_values[b - 1]) + 1) for a, b in pairs]


class KVCache:
    """Ids, llama positions and cells of the tokens held for one sequence."""

    def __init__(self, ctx: SequenceContext, *, track_cells: bool) -> None:
        self.ctx = ctx
        self.cells = CellMap(ctx.n_cells) if track_cells else None
        self.ids = np.zeros(0, dtype=np.int64)
        self.lpos = np.zeros(0, dtype=np.int64)
        self.words = np.zeros(0, dtype=np.int64)  # id of the first token of each one's word
        self._word, self._word_len, self._joins = 0, 0, False
        self.next_id = 0
        self.next_lpos = 0
        self.evicted = 0
        self.compactions = 0
        self.shift_pending = False  # llama.cpp applies seq_shift at the next decode

    @property
    def n_used(self) -> int:
        return len(self.ids)

    def appended(self, n: int, edges: Sequence[tuple[bool, bool, bool]] | None = None) -> None:
        """Record ``n`` tokens just decoded at ``next_lpos...``; ``edges``: for each,
        whether its text starts and ends inside a word and whether it closes the word
        before it (see ``Model.word_edges``; with ``CLOSE_WORDS`` that punctuation is
        kept or evicted with the word)."""
        new_ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        new_lpos = np.arange(self.next_lpos, self.next_lpos + n, dtype=np.int64)
        words = new_ids.copy()
        for i, (starts, ends, closes) in enumerate(edges or ()):
            joins = starts or (closes and CLOSE_WORDS)
            if joins and self._joins and self._word_len < MAX_WORD_TOKENS:
                self._word_len += 1
            else:
                self._word, self._word_len = int(new_ids[i]), 1
            words[i] = self._word
            self._joins = ends
        self.ids = np.concatenate((self.ids, new_ids))
        self.lpos = np.concatenate((self.lpos, new_lpos))
        self.words = np.concatenate((self.words, words))
        self.next_id += n
        self.next_lpos += n
        self.shift_pending = False

    def apply_shifts(self) -> None:
        """llama.cpp applies position shifts at the next decode and does not save them:
        decode one scratch token and remove it again."""
        if not self.shift_pending:
            return
        self.ctx.decode([0], self.next_lpos, logits=False)
        self.drop_scratch()
        self.shift_pending = False

    def drop_scratch(self) -> None:
        """Remove anything decoded past the stream (an observation window)."""
        self.ctx.seq_rm(self.next_lpos, -1)
        if self.cells is not None:
            self.cells.remove(self.next_lpos, np.iinfo(np.int32).max)

    def keep_only(self, keep_ids: np.ndarray, *, evicted: bool = True) -> int:
        """Remove every held token whose id is not in ``keep_ids``; return how many.
        ``evicted``: count them as evicted (False for a copy that is dropped)."""
        mask = np.isin(self.ids, keep_ids, assume_unique=True)
        gone = self.lpos[~mask]
        for p0, p1 in _runs(gone):
            self.ctx.seq_rm(p0, p1)
            if self.cells is not None:
                self.cells.remove(p0, p1)
        self.ids = self.ids[mask]
        self.lpos = self.lpos[mask]
        self.words = self.words[mask]
        if evicted:
            self.evicted += len(gone)
        return len(gone)

    def drop_tail(self, first_id: int) -> int:
        """Remove every held token from id ``first_id`` on (the newest ones) and read
        on from the position after the last one kept: llama.cpp wants each batch to
        start right after the sequence's newest position. Not counted as evicted."""
        later = self.ids >= first_id
        if not later.any():
            return 0
        self.ctx.seq_rm(int(self.lpos[later].min()), -1)
        if self.cells is not None:
            self.cells.remove(int(self.lpos[later].min()), np.iinfo(np.int32).max)
        self.ids, self.lpos, self.words = self.ids[~later], self.lpos[~later], self.words[~later]
        self.next_lpos = int(self.lpos[-1]) + 1 if len(self.lpos) else 0
        return int(later.sum())

    def compact(self, max_gap: int = 0) -> None:
        """Shift held positions down, closing the holes (``seq_shift``): to 0..n-1, or
        with ``max_gap`` > 0, shortening each hole to at most ``max_gap`` positions."""
        steps = np.diff(self.lpos, prepend=self.lpos[:1])
        target = np.cumsum(np.minimum(steps, max_gap + 1)) if len(steps) else steps
        for p0, p1 in _runs(self.lpos):
            i = int(np.searchsorted(self.lpos, p0))
            delta = int(target[i] - p0)
            if delta:
                self.ctx.seq_shift(p0, p1, delta)
                self.shift_pending = True
                if self.cells is not None:
                    self.cells.shift(p0, p1, delta)
        self.lpos = target
        self.next_lpos = int(target[-1]) + 1 if len(target) else 0
        self.compactions += 1

    def rebind(self, ctx: SequenceContext, *, track_cells: bool | None = None) -> None:
        """Follow the sequence into ``ctx``, a context it was restored into: llama.cpp's
        state restore writes the saved cells, in their old cell order, to cells 0..n-1
        of the empty cache. ``track_cells`` turns the cell map on (its order: the
        positions', for a sequence nothing was removed from the middle of) or off."""
        self.ctx = ctx
        if track_cells is False:
            self.cells = None
            return
        if self.cells is not None:
            old = self.cells.pos
            held = old[old != EMPTY]
        elif track_cells:
            held = np.sort(self.lpos)
        else:
            return
        self.cells = CellMap(ctx.n_cells)
        self.cells.pos[: len(held)] = held

    def cell_columns(self) -> np.ndarray:
        """Cell of each held token, in id order (needs cell tracking)."""
        assert self.cells is not None
        return self.cells.columns(self.lpos)
