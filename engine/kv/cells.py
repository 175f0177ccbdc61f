"""The cell map: which KV cell holds which position of the sequence.

Column j of llama.cpp's attention tensor is KV cell j, not position j. After a
removal the cache has holes and llama.cpp writes later tokens into them, so a
policy that scores columns needs this map to score positions.

The map is learnt from the attention itself: a masked cell has probability
exactly 0 in every head, a visible one more than 0. For a batch appended in
position order, the cell that becomes visible at row i and was not visible at
row i-1 holds token i (for row 0: the visible cell the map does not know yet).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import EngineError

EMPTY = -1


class CellMap:
    """Cell <-> position for one sequence in a cache of ``n_cells`` cells."""

    def __init__(self, n_cells: int) -> None:
        self.pos = np.full(n_cells, EMPTY, dtype=np.int64)

    @property
    def n_used(self) -> int:
        return int(np.count_nonzero(self.pos != EMPTY))

    def learn(self, visible: np.ndarray, positions: Sequence[int]) -> np.ndarray:
        """Assign the cells of a batch from its visibility matrix; return them.

        ``visible`` is boolean ``(len(positions), n_kv)``: row i is which cells
        the query at ``positions[i]`` could see on a layer that sees the whole
        cache.
        """
        n_rows, n_kv = visible.shape
        if n_rows != len(positions):
            raise ValueError("one visibility row per position is needed")
        unknown = self.pos[:n_kv] == EMPTY
        before = np.empty_like(visible)
        before[0] = ~unknown
        before[1:] = visible[:-1]
        fresh = visible & ~before & unknown
        counts = fresh.sum(axis=1)
        if not np.all(counts == 1):
            bad = int(np.flatnonzero(counts != 1)[0])
            raise EngineError(
                f"cell map lost track: {int(counts[bad])} new cells at position {positions[bad]}"
            )
        cells = fresh.argmax(axis=1)
        if len(np.unique(cells)) != n_rows:
            raise EngineError("cell map lost track: two positions in one cell")
        self.pos[cells] = np.asarray(positions, dtype=np.int64)
        return cells

    def remove(self, p0: int, p1: int) -> None:
        """Forget positions in ``[p0, p1)`` (as ``seq_rm`` does)."""
        self.pos[(self.pos >= p0) & (self.pos < p1)] = EMPTY

    def shift(self, p0: int, p1: int, delta: int) -> None:
        """Add ``delta`` to positions in ``[p0, p1)`` (as ``seq_add`` does)."""
        hit = (self.pos >= p0) & (self.pos < p1)
        self.pos[hit] += delta

    def columns(self, positions: np.ndarray) -> np.ndarray:
        """The cells holding ``positions`` (each must be present)."""
        used = np.flatnonzero(self.pos != EMPTY)
        order = np.argsort(self.pos[used])
        sorted_pos = self.pos[used][order]
        idx = np.searchsorted(sorted_pos, positions)
        found = sorted_pos[np.minimum(idx, len(sorted_pos) - 1)] if len(sorted_pos) else idx
        if np.any(idx >= len(sorted_pos)) or np.any(found != positions):
            raise EngineError("cell map has no cell for a cached position")
        return used[order][idx]

    def snapshot(self) -> dict[int, int]:
        """``{position: cell}`` for every used cell (for tests and debugging)."""
        return {int(p): int(c) for c, p in enumerate(self.pos) if p != EMPTY}
