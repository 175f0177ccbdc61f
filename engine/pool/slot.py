"""One sequence of a pool, seen as the context a ``Session`` decodes in.

A ``Slot`` has the interface a session already uses (decode, logits, seq_rm,
seq_shift), so the session's eviction, cell map and capture are per sequence by
construction (``kv.context.PooledSequence``). Memory: llama.cpp's ``kv_unified``
pool, one set of cells for every sequence, each tagged with its sequence;
attention masks other sequences' cells to probability exactly 0, so each
sequence's ``CellMap`` learns only its own cells.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import EngineError
from ..native.capture import Captured, Segment
from ..native.context import Pick, picked_token
from ..native.kvmemory import CacheSettings
from ..stats import KVStats
from .scheduler import CancelEvent, Scheduler, SharedContext
from .shares import Want


class Slot:
    """One sequence of a ``KVPool``, seen as the context a ``Session`` decodes in.

    ``n_ctx`` is the sequence's share of cells; ``n_cells`` the pool's cell count
    (the numbering of the attention columns its cell map learns). ``release`` is
    called once, at ``close``."""

    def __init__(
        self,
        shared: SharedContext,
        scheduler: Scheduler,
        release: Callable[[Slot], None],
        seq: int,
        share: int,
        *,
        label: str,
        want: int,
        evicts: bool,
    ) -> None:
        ctx = shared.ctx
        self.shared = shared
        self.scheduler = scheduler
        self.seq = seq
        self.n_ctx = share  # the pool lowers it when others come, raises it when they go
        self.want = want
        self.evicts = evicts
        self.least = 0  # cells its session needs to read on (set as it reads)
        self.n_cells = ctx.n_cells
        self.n_batch = ctx.n_ubatch  # a step's most tokens: one ubatch (a round holds more)
        self.swa_cells = ctx.swa_cells // ctx.n_seq_max
        self.label = label
        self._kept = False
        self.cancel_event = CancelEvent(scheduler)
        self.stats: KVStats | None = None  # the session's, for /metrics
        self.started = time.time()
        self._release = release
        self._out: np.ndarray | None = None
        self._picked: int | None = None
        self._pick_error: Exception | None = None
        self._empty = True  # holds no cells: the pool freed them at the last release
        self._closed = False

    @property
    def kept(self) -> bool:
        """Idle, kept with the text it read for a next request (serve/runner.py): the
        scheduler owes it no batch while it rests."""
        return self._kept

    @kept.setter
    def kept(self, value: bool) -> None:
        self._kept = value
        if value:
            self.scheduler.forget(self.seq)

    @property
    def claim(self) -> Want:
        """What the pool's shares are computed from."""
        return Want(self.want, self.evicts, self.least)

    @property
    def floor(self) -> int:
        """Cells the pool never shrinks this share under (``shares.Want.floor``)."""
        return self.claim.floor

    @property
    def cells_used(self) -> int:
        """Cells its session last reported holding (0 before its first report)."""
        return self.stats.cells_used if self.stats else 0

    def decode(
        self,
        tokens: Sequence[int],
        pos0: int,
        *,
        logits: bool,
        every: bool = False,
        capture: Segment | None = None,
        pick: Pick | None = None,
    ) -> Captured | None:
        """Decode ``tokens`` at ``pos0...`` in the next batch (blocks until it ran);
        ``pick`` runs in the scheduler's thread on the row llama.cpp left (``picked``)."""
        if capture is not None and self.shared.ctx.capture is None:
            raise EngineError("this pool was made without attention capture")
        self._empty = False
        step = self.scheduler.submit(
            self.seq, self.cancel_event, tokens, pos0, logits, every, capture, pick
        )
        if step.out is not None:
            self._out = step.out
        self._picked, self._pick_error = step.picked, step.pick_error
        return step.captured

    def picked(self) -> int:
        """The token the last decode's ``pick`` chose (what it raised, raised here)."""
        return picked_token(self._picked, self._pick_error)

    def last_logits(self) -> np.ndarray:
        if self._out is None:
            raise EngineError("no logits available")
        return self._out[-1]

    def logits_rows(self, n: int) -> np.ndarray:
        if self._out is None or len(self._out) < n:
            raise EngineError("no logits available")
        return self._out[-n:]

    @property
    def cache_settings(self) -> CacheSettings:
        """The pool's K/V types, flash attention and sliding-window cache."""
        return self.shared.cache

    def busy(self) -> threading.Lock:
        """Held around this session's CPU work between decodes (scoring, sampling):
        it then never runs beside a decode, whose threads spin-wait for each other
        and stall when another thread takes their core (docs/multiseq.md §5)."""
        return self.shared.cpu

    def rest(self) -> None:
        """No decode follows soon (an answer ended): the next batch does not wait
        for this sequence."""
        self.scheduler.forget(self.seq)

    def seq_rm(self, p0: int, p1: int) -> None:
        with self.shared.native() as ctx:
            ctx.seq_rm(p0, p1, self.seq)

    def seq_shift(self, p0: int, p1: int, delta: int) -> None:
        with self.shared.native() as ctx:
            ctx.seq_shift(p0, p1, delta, self.seq)

    def pos_max(self) -> int:
        with self.shared.native() as ctx:
            return ctx.pos_max(self.seq)

    def clear(self) -> None:
        """Free the sequence's cells; a sequence that decoded nothing yet has none, and
        does not wait for the decode in flight (a new request's reset would wait a
        whole prompt's decode, and miss the next batch)."""
        if not self._empty:
            self.seq_rm(0, -1)
            self._empty = True
        self._out = None

    def resized(self, n_ctx: int) -> Slot:
        raise EngineError("a pooled sequence keeps the share it was given")

    def close(self) -> None:
        """Free the sequence's cells and its id for the next request."""
        if not self._closed:
            self._closed = True
            self._release(self)
