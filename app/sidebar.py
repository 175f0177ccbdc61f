"""The conversations sidebar: the list, New chat, and Rename / Delete / Export.

A view only: it shows the conversations it is given and says what the user
asked for through signals; the window does the work with the store.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from .store import Conversation


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
        new = QPushButton("New chat")
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        self.export_button = QPushButton("Export…")
        new.clicked.connect(self.new_requested)
        self.rename_button.clicked.connect(self.rename_requested)
        self.delete_button.clicked.connect(self.delete_requested)
        self.export_button.clicked.connect(self.export_requested)
        row = QHBoxLayout()
        for b in (self.rename_button, self.delete_button, self.export_button):
            row.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(new)
        layout.addWidget(self.list)
        layout.addLayout(row)
        self.list.currentItemChanged.connect(self._picked)

    def show_conversations(
        self, conversations: Sequence[Conversation], current: int | None
    ) -> None:
        """Newest first, ``current`` selected; emits nothing."""
        self.list.blockSignals(True)
        self.list.clear()
        for c in conversations:
            item = QListWidgetItem(c.title)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            self.list.addItem(item)
            if c.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)

    def _picked(self, item: QListWidgetItem | None) -> None:
        if item is not None:
            self.selected.emit(int(item.data(Qt.ItemDataRole.UserRole)))
