"""The middle of the window: the attached documents, the transcript, progress and
errors, the last answer's actions, the message box and its buttons.

Widgets only: the window connects them. Buttons that act on an answer (Regenerate,
Copy answer) sit in a row of their own under the transcript, and the row under the
message box holds four, so every label stays whole in a 960-pixel window.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .chat import ChatView, MessageInput
from .store import Message

COPIED_MS = 2000  # how long Copy answer says "Copied"


class ReadingBar(QProgressBar):
    """Tokens read and evicted, or the evicted text a follow-up brings back."""

    def __init__(self) -> None:
        super().__init__()
        self.setVisible(False)

    def show_reading(self, done: int, total: int, evicted: int) -> None:
        self.setVisible(True)
        self.setMaximum(max(total, 1))
        self.setValue(done)
        self.setFormat(f"reading {done:,} / {total:,} tokens · {evicted:,} evicted")

    def show_recall(self, tokens: int, passages: int) -> None:
        self.setVisible(True)
        self.setFormat(
            f"brought back {tokens:,} evicted tokens from {passages} "
            f"passage{'s' if passages != 1 else ''} for this question"
        )


class ErrorLine(QLabel):
    """One red line for what went wrong; takes no room when there is nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.setStyleSheet("color: #e05545;")
        self.setWordWrap(True)
        self.setVisible(False)

    def setText(self, text: str) -> None:  # type: ignore[override]
        super().setText(text)
        self.setVisible(bool(text))

    def clear(self) -> None:
        self.setText("")


class SwitchNote(QWidget):
    """A settings change that re-reads the chat, said before it does, with a button
    that keeps the settings its cache was made with."""

    def __init__(self) -> None:
        super().__init__()
        self.text = QLabel()
        self.text.setWordWrap(True)
        self.keep_button = QPushButton("Keep the old settings")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.keep_button)
        self.setVisible(False)

    def show_note(self, text: str | None) -> None:
        self.text.setText(text or "")
        self.setVisible(bool(text))


def _small(text: str, tip: str) -> QToolButton:
    """A compact text button (a QPushButton is never narrower than 80 pixels)."""
    button = QToolButton()
    button.setText(text)
    button.setToolTip(tip)
    button.setAutoRaise(True)
    return button


class ChatPane(QWidget):
    """Holds the chat's widgets; ``send`` is what Enter in the message box does."""

    def __init__(self, messages: Callable[[], Sequence[Message]], send: Callable[[], None]) -> None:
        super().__init__()
        self.doc_label = QLabel()
        self.doc_label.setWordWrap(True)
        self.detach_button = QPushButton("Detach")
        self.chat = ChatView(messages)
        self.progress = ReadingBar()
        self.error = ErrorLine()
        self.switch_note = SwitchNote()
        self.regenerate_button = _small(
            "Regenerate", "Answer the last question again, with sampling"
        )
        self.copy_button = _small("Copy answer", "Copy the last answer to the clipboard")
        self._copied = QTimer(self)  # a child: it dies with the pane
        self._copied.setSingleShot(True)
        self._copied.timeout.connect(lambda: self.copy_button.setText("Copy answer"))
        self.input = MessageInput(send)
        self.attach_button = QPushButton("Attach…")
        self.summarize_button = QPushButton("Summarize")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        layout = QVBoxLayout(self)
        layout.addLayout(_row(self.doc_label, 1, self.detach_button))
        layout.addWidget(self.chat, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.error)
        layout.addWidget(self.switch_note)
        layout.addLayout(_row(None, self.regenerate_button, self.copy_button))
        layout.addWidget(self.input)
        layout.addLayout(
            _row(
                self.attach_button, self.summarize_button, None, self.stop_button, self.send_button
            )
        )

    def set_busy(self, busy: bool) -> None:
        """While an answer is written only Stop acts on it."""
        for button in (self.send_button, self.summarize_button, self.regenerate_button):
            button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def show_documents(self, names: Sequence[str], chars: int) -> None:
        """The documents line, Detach, and what an empty chat says, for these files."""
        listed = ", ".join(names)
        if not names:
            self.doc_label.setText("No document attached: drop files here or use Attach…")
            self.chat.empty_text = "Drop a document to begin, or ask a question below."
        else:
            self.doc_label.setText(
                f"<b>{html.escape(listed)}</b> ({chars:,} characters): "
                "Summarize it, or ask about it below."
            )
            self.chat.empty_text = f"{listed} attached: Summarize it, or ask about it below."
        self.detach_button.setVisible(bool(names))

    def confirm_copied(self) -> None:
        """Copy answer says "Copied" for a moment."""
        self.copy_button.setText("Copied ✓")
        self._copied.start(COPIED_MS)


def _row(*items: QWidget | int | None) -> QHBoxLayout:
    """Widgets left to right; None is a stretch, an int the stretch of the widget before."""
    row = QHBoxLayout()
    for item in items:
        if item is None:
            row.addStretch(1)
        elif isinstance(item, int):
            row.setStretch(row.count() - 1, item)
        else:
            row.addWidget(item)
    return row
