"""The conversations sidebar: the list, New chat, and Rename / Delete / Export.

A view only: it shows the conversations it is given and says what the user
asked for through signals; the window does the work with the store. Long titles
end in an ellipsis, with the whole title as the item's tooltip; a new chat that
holds no message yet is listed first, in italics, and is not in the store.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from .store import Conversation

DRAFT_TITLE = "New chat"


class Sidebar(QWidget):
    """``selected(id)`` when the user picks a conversation; buttons re-emit clicks."""

    selected = Signal(int)
    new_requested = Signal()
    rename_requested = Signal()
    delete_requested = Signal()
    export_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setUniformItemSizes(True)
        new = QPushButton("New chat")
        new.setToolTip("Start a new chat (Ctrl+N)")
        row = QHBoxLayout()
        buttons = []
        for text, signal in (
            ("Rename", self.rename_requested),
            ("Delete", self.delete_requested),
            ("Export…", self.export_requested),
        ):
            button = QToolButton()  # narrower than a QPushButton's 80-pixel minimum
            button.setText(text)
            button.clicked.connect(signal)
            row.addWidget(button)
            buttons.append(button)
        self.rename_button, self.delete_button, self.export_button = buttons
        new.clicked.connect(self.new_requested)
        layout = QVBoxLayout(self)
        layout.addWidget(new)
        layout.addWidget(self.list)
        layout.addLayout(row)
        self.list.currentItemChanged.connect(self._picked)

    def show_conversations(
        self, conversations: Sequence[Conversation], current: int | None
    ) -> None:
        """Newest first, ``current`` selected, or when it is None an unsaved new chat
        on top; emits nothing."""
        self.list.blockSignals(True)
        self.list.clear()
        if current is None:
            draft = QListWidgetItem(DRAFT_TITLE)
            font = draft.font()
            font.setItalic(True)
            draft.setFont(font)
            draft.setToolTip("Saved once it holds a message")
            self.list.addItem(draft)
            self.list.setCurrentItem(draft)
        for c in conversations:
            item = QListWidgetItem(c.title)
            item.setToolTip(c.title)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            self.list.addItem(item)
            if c.id == current:
                self.list.setCurrentItem(item)
        for button in (self.rename_button, self.export_button):
            button.setEnabled(current is not None)
        self.list.blockSignals(False)

    def _picked(self, item: QListWidgetItem | None) -> None:
        cid = item.data(Qt.ItemDataRole.UserRole) if item is not None else None
        if cid is not None:
            self.selected.emit(int(cid))
