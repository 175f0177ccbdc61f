"""The window's dialogs, each returning what the user chose (None: cancelled)."""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import QStandardPaths
from PySide6.QtWidgets import QFileDialog, QInputDialog, QWidget

from engine.documents.load import SUFFIXES

DOCUMENT_TYPES = (
    f"Documents ({' '.join('*' + suffix for suffix in SUFFIXES)})"  # what the CLI reads
)


def export_name(title: str) -> str:
    """A file name for a chat's export: its title without characters file systems
    refuse (``/\\:*?"<>|``, control characters), at most 80 characters, ``.md``."""
    name = re.sub(r'[\x00-\x1f\x7f/\\:*?"<>|]+', " ", title)
    name = " ".join(name.split()).strip(" .")[:80].strip(" .")
    return f"{name or 'chat'}.md"


def ask_title(parent: QWidget, title: str) -> str | None:
    """A chat's new title."""
    text, ok = QInputDialog.getText(parent, "Rename chat", "Title:", text=title)
    return text if ok and text.strip() else None


def ask_export_path(parent: QWidget, title: str) -> Path | None:
    """Where to export a chat, offering its title as the name in the documents folder."""
    folder = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    proposed = str(Path(folder or Path.home()) / export_name(title))
    name, _ = QFileDialog.getSaveFileName(parent, "Export chat", proposed, "Markdown (*.md)")
    return Path(name) if name else None


def ask_documents(parent: QWidget) -> list[Path]:
    """Documents to attach (any type the CLI reads)."""
    names, _ = QFileDialog.getOpenFileNames(parent, "Attach documents", "", DOCUMENT_TYPES)
    return [Path(name) for name in names]
