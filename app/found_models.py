"""The models LM Studio, Ollama and Hugging Face already downloaded, as a list to
choose from (engine/native/finder.py looks; this shows what it found)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QPushButton, QSizePolicy, QWidget

from engine.native.finder import FoundModel, format_size


class FoundModels(QWidget):
    """A list of found models and Refresh; ``chosen`` carries a chosen model's path.
    The first look happens when ``look`` is first called (the panel's first show)."""

    chosen = Signal(str)

    def __init__(self, find: Callable[[], list[FoundModel]]) -> None:
        super().__init__()
        self._find = find
        self.found: list[FoundModel] = []
        self.scanned = False
        self.combo = QComboBox()  # as narrow as a short item: long ones cut in the box only
        adjust = QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        self.combo.setSizeAdjustPolicy(adjust)
        self.combo.setMinimumContentsLength(8)
        self.combo.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.combo.activated.connect(self._choose)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.setToolTip("Look again for downloaded models")
        self.refresh_button.clicked.connect(self.refresh)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.combo, 1)
        row.addWidget(self.refresh_button)
        self.current = ""  # the loaded model's path, shown selected when it was found
        self.show_found()

    def refresh(self) -> None:
        """Look again (bounded file-system work: at most a few seconds on a slow disk)."""
        self.scanned = True
        QGuiApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            self.found = self._find()
        finally:
            QGuiApplication.restoreOverrideCursor()
        self.show_found()

    def show_found(self) -> None:
        combo = self.combo
        combo.blockSignals(True)
        combo.clear()
        if not self.scanned:
            combo.addItem("Not looked yet", None)
        elif not self.found:
            combo.addItem("None found", None)
            combo.setItemData(
                0,
                "No GGUF model from LM Studio, Ollama or Hugging Face",
                Qt.ItemDataRole.ToolTipRole,
            )
        else:
            n = len(self.found)
            combo.addItem(f"Choose one of {n} model{'s' if n > 1 else ''}…", None)
        for m in self.found:
            combo.addItem(f"{m.name} · {m.source} · {format_size(m.size_bytes)}", str(m.path))
            combo.setItemData(combo.count() - 1, str(m.path), Qt.ItemDataRole.ToolTipRole)
        combo.blockSignals(False)
        self.select(self.current)

    def select(self, path: str) -> None:
        """Show ``path`` (the loaded model) in the list when it is one of those found."""
        self.current = path
        index = self.combo.findData(path) if self.found else -1
        self.combo.blockSignals(True)
        self.combo.setCurrentIndex(max(0, index))
        self.combo.blockSignals(False)

    def _choose(self, index: int) -> None:
        path = self.combo.itemData(index)
        if path:
            self.chosen.emit(str(path))
