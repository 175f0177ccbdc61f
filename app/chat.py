"""The chat transcript and the message box.

``ChatView`` renders stored messages plus the answer being streamed as Markdown;
streamed tokens re-render at most every ``RENDER_MS``, because rendering holds
the GIL that the engine thread's attention callback needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QTextBrowser

from .store import Message

RENDER_MS = 60


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
    """Shows ``messages()`` and, while one streams, the partial answer."""

    def __init__(self, messages: Callable[[], Sequence[Message]]) -> None:
        super().__init__()
        self.setOpenExternalLinks(True)
        self._messages = messages
        self.streaming = ""  # the answer so far
        self.replacing: int | None = None  # a message the streamed answer replaces
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
        parts = []
        for m in self._messages():
            if m.id == self.replacing and self.streaming:
                continue  # the regenerated answer streams in its place
            who = "**You**" if m.role == "user" else "**kvtrim**"
            meta = f"\n\n*{m.meta}*" if m.meta else ""
            parts.append(f"{who}\n\n{m.content}{meta}")
        if self.streaming:
            parts.append(f"**kvtrim**\n\n{self.streaming}▍")
        self.setMarkdown("\n\n---\n\n".join(parts) or "*Drop a document to begin.*")
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())
