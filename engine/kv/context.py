"""What a sequence decodes through, as the layers above see it.

A lone session owns a ``native.context.NativeContext``; a pooled one decodes
through a ``pool.slot.Slot``, one sequence of a shared context. Both satisfy
``SequenceContext``; a slot also says its share (``PooledSequence``). Sizes in
cells, positions in tokens.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ..native.capture import Captured, Segment
from ..native.context import Pick
from ..native.kvmemory import CacheSettings
from ..stats import KVStats


class SequenceContext(Protocol):
    """Decoding, logits and the KV calls of one sequence."""

    n_ctx: int
    n_batch: int
    swa_cells: int
    cancel_event: threading.Event

    @property
    def n_cells(self) -> int:
        """Cells of the whole context (the numbering of attention columns)."""
        ...

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
        """Decode ``tokens`` at ``pos0...``; ``pick`` chooses the next token from the
        last row's logits where llama.cpp left them (``picked``), none read out."""
        ...

    def picked(self) -> int:
        """The token the last decode's ``pick`` chose."""
        ...

    def last_logits(self) -> np.ndarray: ...

    def logits_rows(self, n: int) -> np.ndarray: ...

    def busy(self) -> contextlib.AbstractContextManager[object]: ...

    def rest(self) -> None:
        """No decode follows soon (an answer ended): a pool's next batch need not
        wait for this sequence."""
        ...

    def seq_rm(self, p0: int, p1: int) -> None: ...

    def seq_shift(self, p0: int, p1: int, delta: int) -> None: ...

    def pos_max(self) -> int: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class PooledSequence(SequenceContext, Protocol):
    """A sequence of a shared context: ``n_ctx`` is its share, which the pool
    changes as requests come and go; ``least`` the cells its session needs to read
    on; ``stats`` what the session last reported (for ``/metrics``)."""

    least: int
    stats: KVStats | None

    @property
    def floor(self) -> int:
        """Cells the pool never shrinks its share under (while ``least`` stays)."""
        ...

    @property
    def cache_settings(self) -> CacheSettings:
        """The pool's K/V types, flash attention and sliding-window cache."""
        ...
