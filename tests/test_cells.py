"""The cell map on synthetic masks: holes, refills, shifts and lost track."""

from __future__ import annotations

import numpy as np
import pytest

from engine import EngineError
from engine.cells import CellMap


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
