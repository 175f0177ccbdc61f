"""The chat transcript and the message box.

``ChatView`` shows stored messages plus the answer being written, each as HTML
built by ``transcript`` (the text as written: a bare "48213." stays text). Until
its first token, the answer being written shows its stage ("reading 512 / 8,876
tokens"); streamed tokens re-render at most every ``RENDER_MS``, because rendering
holds the GIL that the engine thread's attention callback needs.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeyEvent, QShowEvent
from PySide6.QtWidgets import QPlainTextEdit, QTextBrowser

from .store import Message
from .transcript import to_html

RENDER_MS = 60
SPEAKERS = {"user": "You", "assistant": "kvtrim", "system": "System"}
_DIM = "color:#8a9099"


@dataclass
class Pending:
    """The answer being written: its ``text`` so far (the answer prefix, then what
    the model ``writing`` wrote) and, until its first token, its ``stage``; it takes
    the place of message ``replaces`` (Regenerate) while it is written."""

    text: str = ""
    stage: str = "reading…"
    replaces: int | None = None
    writing: bool = False


def message_html(speaker: str, body: str, meta: str = "") -> str:
    """A speaker label first, then the body (HTML), then the figures, dimmed."""
    out = f'<p style="margin-top:14px; margin-bottom:2px"><b>{html.escape(speaker)}</b></p>{body}'
    if meta:
        out += f'<p style="{_DIM}; margin-top:2px"><i>{html.escape(meta)}</i></p>'
    return out


class MessageInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    def __init__(self, send: Callable[[], None]) -> None:
        super().__init__()
        self._send = send
        self.setPlaceholderText("Ask about the document, or drop a file here…")
        self.setMaximumHeight(90)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self._send()
            return
        super().keyPressEvent(event)


class ChatView(QTextBrowser):
    """Shows ``messages()`` and, while one is written, the ``pending`` answer."""

    def __init__(self, messages: Callable[[], Sequence[Message]]) -> None:
        super().__init__()
        self.setOpenExternalLinks(True)
        self._messages = messages
        self.pending: Pending | None = None
        self.empty_text = "Drop a document to begin."  # what an empty chat says
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(RENDER_MS)
        self._timer.timeout.connect(self.render)

    def render_soon(self) -> None:
        if not self._timer.isActive():
            self._timer.start()

    def stop(self) -> None:
        """No more renders (the window is closing and the store with it)."""
        self._timer.stop()

    def render(self) -> None:  # type: ignore[override]
        self._timer.stop()
        pending = self.pending
        parts = [
            message_html(SPEAKERS.get(m.role, m.role), to_html(m.content), m.meta)
            for m in self._messages()
            if pending is None or m.id != pending.replaces  # the new answer takes its place
        ]
        if pending is not None:
            if pending.writing:
                body = to_html(pending.text + "▍")
            else:
                body = to_html(pending.text) if pending.text.strip() else ""
                body += f'<p style="{_DIM}"><i>{html.escape(pending.stage)}</i></p>'
            parts.append(message_html(SPEAKERS["assistant"], body))
        if not parts:
            parts = [f'<p style="{_DIM}"><i>{html.escape(self.empty_text)}</i></p>']
        shade = self.palette().alternateBase().color().name()  # code on a light or dark shade
        self.document().setDefaultStyleSheet(
            f"p {{ margin-top: 3px; margin-bottom: 3px; }} pre {{ background-color: {shade}; }}"
            f" code {{ background-color: {shade}; }}"
        )
        self.setHtml("".join(parts))
        self.to_bottom()

    def to_bottom(self) -> None:
        """Scroll to the newest message."""
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def showEvent(self, event: QShowEvent) -> None:
        """Shown for the first time (or again): the newest message, once laid out."""
        super().showEvent(event)
        QTimer.singleShot(0, self, self.to_bottom)
