"""The Memory view renders offscreen, follows live maps, and its minimap scrolls."""

from __future__ import annotations

import itertools

import numpy as np
from helpers.docs_for_tests import PASSKEY_PREFIX, PASSKEY_SUFFIX, passkey_document
from PySide6.QtCore import QPoint, Qt

from app.memory_view import MemoryView
from engine import Prompt
from engine.session.trace import (
    EVICTED,
    HEADING,
    KEPT_ROLES,
    RECALLED,
    SCORED,
    TOP,
    UNREAD,
    MemoryMap,
    Segment,
    display_roles,
    strip,
)


def _synthetic() -> MemoryMap:
    text = "alpha beta gamma delta " * 400
    n = len(text) // 6
    starts = np.arange(n) * 6
    ends = np.append(starts[1:], len(text))
    roles = np.full(n, EVICTED, np.uint8)
    roles[: n // 2 : 3] = SCORED
    roles[-5:] = UNREAD
    scores = np.linspace(0, 1, n).astype(np.float32)
    seg = Segment("document", text, 0, starts, ends)
    return MemoryMap("snapkv", 64, n - 5, int((roles == SCORED).sum()), [seg], [roles], [scores])


def test_display_roles_cover_every_character():
    text, roles = display_roles(_synthetic())
    assert len(text) == len(roles) and text.startswith("── document ──\n")
    assert (roles == HEADING).sum() == len("── document ──\n")
    assert (roles == TOP).any() and (roles == EVICTED).any() and (roles == UNREAD).any()


def test_a_maps_display_is_computed_once_where_it_is_asked_first():
    m = _synthetic()
    first = display_roles(m)  # the app's worker asks here, off the window's thread
    assert display_roles(m) is first


def _strip_cell(chunk: np.ndarray) -> tuple[float, str]:
    """One minimap cell as strip()'s docstring says, read one cell at a time."""
    share = float(np.isin(chunk, KEPT_ROLES).mean()) if len(chunk) else 0.0
    for role, name in ((TOP, "top"), (RECALLED, "recalled")):
        if (chunk == role).any():
            return share, name
    if share >= 0.5:
        return share, "kept"
    return share, "evicted" if (chunk == EVICTED).any() else "unread"


def test_the_minimap_strip_matches_each_cell_read_alone():
    rng = np.random.default_rng(3)
    for n, cells in [(0, 4), (3, 10), (10, 3), (1000, 37), (20_000, 600), (7, 7)]:
        roles = rng.choice([SCORED, EVICTED, UNREAD, TOP, RECALLED, HEADING], n).astype(np.uint8)
        roles[: n // 2] = rng.choice([SCORED, EVICTED, UNREAD], n // 2)
        shares, classes = strip(roles, cells)
        edges = np.linspace(0, n, cells + 1).astype(np.int64)
        want = [_strip_cell(roles[a : max(b, a + 1)]) for a, b in itertools.pairwise(edges)]
        assert np.allclose(shares, [w[0] for w in want]) and classes == [w[1] for w in want]


def test_view_draws_when_shown_and_minimap_click_scrolls(qtbot):
    view = MemoryView()
    qtbot.addWidget(view)
    view.show_map(_synthetic())  # hidden: kept for later
    assert view.text.toPlainText() == ""
    view.resize(400, 300)
    view.show()
    qtbot.waitExposed(view)
    assert "snapkv" in view.summary.text() and view.text.toPlainText().startswith("── document")
    assert len(view.minimap.roles) == len(view.text.toPlainText())
    qtbot.mouseClick(
        view.minimap, Qt.MouseButton.LeftButton, pos=QPoint(5, int(view.minimap.height() * 0.9))
    )
    n = view.text.document().characterCount()
    assert view.text.textCursor().position() > 0.8 * n
    assert view.minimap.view[0] > 0.3  # the viewport marker moved down too
    image = view.grab()
    assert not image.isNull()


def test_real_needle_map_shows_the_kept_key(qtbot, engine):
    key = 48213
    doc = passkey_document(100, 0.4, key)
    prompt = Prompt(PASSKEY_PREFIX, doc, PASSKEY_SUFFIX, (), True)
    view = MemoryView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.show()
    with engine.session("snapkv", 256) as s:
        for event in s.run(prompt, max_tokens=6):
            if type(event).__name__ == "Progress" and event.done < event.total:
                view.show_map(s.memory_map())  # live, mid-prefill
                mid = view.roles.copy()
        view.show_map(s.memory_map())
        qtbot.waitUntil(lambda: not view._timer.isActive(), timeout=5000)
    assert (mid == UNREAD).any(), "mid-prefill, the end of the document is not read yet"
    text = view.text.toPlainText()
    at = text.index(str(key))
    assert view.roles[at : at + 5].tolist() != [EVICTED] * 5, "SnapKV keeps the needle"
    assert (view.roles == EVICTED).mean() > 0.5
