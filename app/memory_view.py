"""The Memory view: the text the model read, with what its cache still holds.

Evicted spans are dimmed, kept spans normal, the strongest-scored ones highlighted,
sinks underlined and the recent window tinted; text not read yet is faint. A
minimap along the side shows kept/evicted over the whole text (click to scroll).
It takes ``engine.trace.MemoryMap`` snapshots, which the worker sends twice a
second while it reads and answers.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from PySide6.QtCore import QRect, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QShowEvent,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from engine.session.trace import (
    EVICTED,
    HEADING,
    KEPT_ROLES,
    RECALLED,
    RECENT,
    SCORED,
    SINK,
    TOP,
    UNREAD,
    MemoryMap,
    display_roles,
    strip,
)

EMPTY = "Ask about a document to see what the model keeps of it."
COST_FACTOR = 4  # a draw that takes t ms waits 4t ms before the next (at most 20% of the GUI)
NAMES = {
    "prompt": "prompt",
    "document": "document",
    "question": "question",
    "answer": "answer",
    "turn": "your message",
    "recalled": "brought back for your question",
}

LIGHT = {
    UNREAD: ("#b8bcc2", None),
    EVICTED: ("#9aa0a6", None),
    SCORED: (None, None),
    SINK: (None, "#dbe7ff"),
    RECENT: (None, "#dff3ee"),
    TOP: (None, "#ffe29a"),
    HEADING: ("#5f6368", None),
    RECALLED: (None, "#e8dcff"),
}
DARK = {
    UNREAD: ("#50555c", None),
    EVICTED: ("#6b7078", None),
    SCORED: (None, None),
    SINK: (None, "#1f2f4d"),
    RECENT: (None, "#173832"),
    TOP: (None, "#5a4710"),
    HEADING: ("#9aa0a6", None),
    RECALLED: (None, "#3b2d5c"),
}
MINIMAP = {
    "unread": "#d5d8dc",
    "evicted": "#b0b4ba",
    "kept": "#2a9d8f",
    "top": "#e9a23b",
    "recalled": "#8e6bd8",
}


class _Highlighter(QSyntaxHighlighter):
    """Formats each block from the per-character role array."""

    def __init__(self, view: MemoryView) -> None:
        super().__init__(view.text.document())
        self.view = view
        self.formats: dict[int, QTextCharFormat] = {}

    def set_palette(self, colours: dict[int, tuple[str | None, str | None]]) -> None:
        self.formats = {}
        for role, (fg, bg) in colours.items():
            if role == SCORED:
                continue  # kept text keeps the normal format
            f = QTextCharFormat()
            if fg:
                f.setForeground(QColor(fg))
            if bg:
                f.setBackground(QColor(bg))
            if role == SINK:
                f.setFontUnderline(True)
            if role == UNREAD:
                f.setFontItalic(True)
            if role == HEADING:
                f.setFontWeight(QFont.Weight.Bold)
            self.formats[role] = f

    def highlightBlock(self, text: str) -> None:
        roles = self.view.roles
        start = self.currentBlock().position()
        block = roles[start : start + len(text)]
        if not len(block):
            return
        cuts = np.flatnonzero(np.diff(block)) + 1
        bounds = np.concatenate(([0], cuts, [len(block)]))
        for a, b in itertools.pairwise(bounds):
            fmt = self.formats.get(int(block[a]))
            if fmt is not None:
                self.setFormat(int(a), int(b - a), fmt)


class _Minimap(QWidget):
    """Kept/evicted over the whole text, one colour per pixel row; click to jump."""

    clicked = Signal(float)  # where, as a fraction of the text

    def __init__(self) -> None:
        super().__init__()
        self.setFixedWidth(16)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip("Kept (teal), evicted (grey), strongest scores (amber): click to go there")
        self.roles = np.zeros(0, np.uint8)
        self.view = (0.0, 0.0)  # visible part of the text, as fractions
        self._rows: list[str] = []  # one strip class per pixel row, for the current roles

    def set_roles(self, roles: np.ndarray) -> None:
        self.roles = roles
        self._rows = []
        self.update()

    def paintEvent(self, event: QPaintEvent) -> None:
        p = QPainter(self)
        h = self.height()
        p.fillRect(self.rect(), QColor(MINIMAP["unread"]))
        if len(self.roles) and h > 0:
            if len(self._rows) != h:  # new roles or a new height
                self._rows = strip(self.roles, h)[1]
            for y, cls in enumerate(self._rows):
                p.fillRect(0, y, self.width(), 1, QColor(MINIMAP[cls]))
        top, bottom = self.view
        p.setPen(QColor("#202124"))
        p.drawRect(QRect(0, int(top * h), self.width() - 1, max(int((bottom - top) * h), 2)))
        p.end()

    def mousePressEvent(self, event: QMouseEvent) -> None:
        self.clicked.emit(min(max(event.position().y() / max(self.height(), 1), 0.0), 1.0))


class MemoryView(QWidget):
    """The text with its cache state; ``show_map`` takes a new snapshot."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.roles = np.zeros(0, np.uint8)
        self.map: MemoryMap | None = None
        self._cost_ms = 0.0  # how long the last draw took
        self._drawn_at = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._draw)
        self.summary = QLabel(EMPTY)
        self.summary.setWordWrap(True)
        legend = QLabel(
            '<span style="background:#ffe29a">&nbsp;strongest&nbsp;</span> '
            '<span style="background:#dff3ee">&nbsp;recent&nbsp;</span> '
            '<span style="background:#e8dcff">&nbsp;brought back&nbsp;</span> '
            '<u>sink</u> kept <span style="color:#9aa0a6">evicted</span> '
            '<i style="color:#b8bcc2">not read yet</i>'
        )
        legend.setWordWrap(True)  # a narrow tab wraps it instead of cutting it
        self.text = QPlainTextEdit()
        self.text.setReadOnly(True)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.highlighter = _Highlighter(self)
        self.highlighter.set_palette(LIGHT)
        self.minimap = _Minimap()
        self.minimap.clicked.connect(self.scroll_to)
        self.text.verticalScrollBar().valueChanged.connect(self._viewport_moved)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.text, 1)
        row.addWidget(self.minimap)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.summary)
        layout.addWidget(legend)
        layout.addLayout(row, 1)

    def clear(self) -> None:
        """Another chat is shown: nothing of the last one's text."""
        self._timer.stop()
        self.map = None
        self.roles = np.zeros(0, np.uint8)
        self.text.clear()
        self.minimap.set_roles(self.roles)
        self.summary.setText(EMPTY)

    def set_dark(self, dark: bool) -> None:
        self.highlighter.set_palette(DARK if dark else LIGHT)
        self.highlighter.rehighlight()

    def show_map(self, m: MemoryMap) -> None:
        """Take a snapshot; it is drawn now if the view is visible and the last draw
        was not long ago in proportion to its cost, else soon (or when shown)."""
        self.map = m
        if not self.isVisible():
            return  # drawn by showEvent
        wait_ms = COST_FACTOR * self._cost_ms - (time.monotonic() - self._drawn_at) * 1000
        if wait_ms > 0:
            if not self._timer.isActive():
                self._timer.start(int(wait_ms))
            return
        self._draw()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.map is not None:
            self._draw()

    def _draw(self) -> None:
        self._timer.stop()
        m = self.map
        if m is None:
            return
        start = time.monotonic()
        text, roles = display_roles(m)
        old = self.text.toPlainText()
        self.roles = roles
        bar = self.text.verticalScrollBar()
        at = bar.value()
        if text != old:
            if old and text.startswith(old):  # an answer growing: append, keep the layout
                cursor = QTextCursor(self.text.document())
                cursor.movePosition(QTextCursor.MoveOperation.End)
                cursor.insertText(text[len(old) :])
            else:
                self.text.setPlainText(text)
        self.highlighter.rehighlight()
        bar.setValue(at)
        self.minimap.set_roles(roles)
        self._viewport_moved()
        kept = int(np.isin(roles, KEPT_ROLES).sum())
        seen = int((roles != UNREAD).sum() - (roles == HEADING).sum())
        self.summary.setText(
            f"<b>{m.policy}</b>, budget {m.budget_tokens:,}: the cache holds "
            f"<b>{m.tokens_kept:,} of {m.tokens_seen:,}</b> tokens read "
            f"({m.retention:.1%}); {kept:,} of {max(seen, 0):,} characters kept."
            + self._recall_note(roles)
        )
        self._drawn_at = time.monotonic()
        self._cost_ms = (self._drawn_at - start) * 1000

    @staticmethod
    def _recall_note(roles: np.ndarray) -> str:
        """Where the latest follow-up brought evicted text back, say how much."""
        back = int((roles == RECALLED).sum())
        if not back:
            return ""
        return (
            f" <span style='background:#e8dcff'>&nbsp;{back:,} evicted characters&nbsp;</span>"
            " were brought back for the latest question."
        )

    def scroll_to(self, fraction: float) -> None:
        """Centre the text at ``fraction`` of its length (a minimap click)."""
        n = self.text.document().characterCount()
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(min(int(fraction * n), max(n - 1, 0)))
        self.text.setTextCursor(cursor)
        self.text.centerCursor()

    def _viewport_moved(self) -> None:
        """The minimap's frame: the characters visible now, as fractions of the text."""
        n = max(self.text.document().characterCount(), 1)
        area = self.text.viewport().rect()
        top = self.text.cursorForPosition(area.topLeft()).position()
        bottom = self.text.cursorForPosition(area.bottomRight()).position()
        self.minimap.view = (top / n, max(bottom, top + 1) / n)
        self.minimap.update()
