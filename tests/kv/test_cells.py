"""The cell map on synthetic masks: holes, refills, shifts and lost track."""

from __future__ import annotations

import numpy as np
import pytest

from engine import EngineError
from engine.kv.cells import CellMap


def _visibility(cell_pos: dict[int, int], batch: list[tuple[int, int]], n_kv: int) -> np.ndarray:
    """Causal mask rows for ``batch`` = [(cell, pos)], given existing cells."""
    allpos = dict(cell_pos)
    allpos.update(dict(batch))
    rows = []
    for _, p in batch:
        row = np.zeros(n_kv, bool)
        for c, q in allpos.items():
            row[c] = q <= p
        rows.append(row)
    return np.array(rows)


def test_fresh_prefill_maps_cells_to_positions():
    m = CellMap(8)
    batch = [(i, i) for i in range(5)]
    cells = m.learn(_visibility({}, batch, 8), [p for _, p in batch])
    assert list(cells) == [0, 1, 2, 3, 4]
    assert m.snapshot() == {i: i for i in range(5)}


def test_holes_are_refilled_out_of_order():
    m = CellMap(10)
    m.learn(_visibility({}, [(i, i) for i in range(8)], 10), list(range(8)))
    m.remove(2, 5)
    assert m.n_used == 5
    existing = {c: p for p, c in m.snapshot().items()}
    # llama.cpp writes the next tokens (positions 8, 9, 10) into cells 2, 3, 4
    batch = [(2, 8), (3, 9), (4, 10)]
    cells = m.learn(_visibility(existing, batch, 10), [8, 9, 10])
    assert list(cells) == [2, 3, 4]
    assert m.snapshot()[10] == 4
    assert list(m.columns(np.array([0, 1, 5, 8, 10]))) == [0, 1, 5, 2, 4]


def test_shift_moves_positions_not_cells():
    m = CellMap(6)
    m.learn(_visibility({}, [(i, i) for i in range(6)], 6), list(range(6)))
    m.remove(1, 3)
    m.shift(3, 6, -2)
    assert m.snapshot() == {0: 0, 1: 3, 2: 4, 3: 5}


def test_ambiguous_mask_is_an_error_not_a_guess():
    m = CellMap(4)
    vis = np.array([[True, True, False, False]])  # two new cells for one token
    with pytest.raises(EngineError, match="lost track"):
        m.learn(vis, [0])


class _ShiftLog:
    """A stand-in context that records ``seq_rm``/``seq_shift`` calls."""

    n_cells = 64

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def seq_rm(self, p0: int, p1: int) -> None:
        self.calls.append(("rm", p0, p1))

    def seq_shift(self, p0: int, p1: int, delta: int) -> None:
        self.calls.append(("shift", p0, p1, delta))


@pytest.mark.parametrize(
    ("max_gap", "want"),
    [
        (0, [0, 1, 2, 3, 4, 5]),  # compact: 0..n-1
        (3, [0, 1, 5, 6, 10, 11]),  # holes of 9 and 5 shortened to 3
        (100, [0, 1, 11, 12, 18, 19]),  # no hole is longer: nothing moves
    ],
)
def test_compaction_shortens_holes_to_the_gap(max_gap, want):
    from engine.kv.cache import KVCache

    ctx = _ShiftLog()
    cache = KVCache(ctx, track_cells=False)  # type: ignore[arg-type]
    cache.appended(20)
    cache.keep_only(np.array([0, 1, 11, 12, 18, 19]))
    ctx.calls.clear()
    cache.compact(max_gap)
    assert cache.lpos.tolist() == want
    assert cache.next_lpos == want[-1] + 1
    moved = [c for c in ctx.calls if c[0] == "shift"]
    runs = [(0, 2), (11, 13), (18, 20)]
    expected = [("shift", a, b, w - a) for (a, b), w in zip(runs, want[::2], strict=True)]
    assert moved == [e for e in expected if e[3]]
