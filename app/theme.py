"""Light and dark themes: Qt's Fusion style with a palette, following the system
colour scheme unless the user picked one."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

DARK = {
    QPalette.ColorRole.Window: "#1f2226",
    QPalette.ColorRole.WindowText: "#e6e6e6",
    QPalette.ColorRole.Base: "#16181b",
    QPalette.ColorRole.AlternateBase: "#23262b",
    QPalette.ColorRole.Text: "#e6e6e6",
    QPalette.ColorRole.Button: "#2a2e33",
    QPalette.ColorRole.ButtonText: "#e6e6e6",
    QPalette.ColorRole.Highlight: "#2a9d8f",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.ToolTipBase: "#2a2e33",
    QPalette.ColorRole.ToolTipText: "#e6e6e6",
    QPalette.ColorRole.PlaceholderText: "#8a9099",
    QPalette.ColorRole.Link: "#6cc4b8",
}


def is_dark(mode: str) -> bool:
    """``mode`` is system, light or dark; system asks Qt for the desktop's scheme."""
    if mode in ("light", "dark"):
        return mode == "dark"
    hints = QGuiApplication.styleHints()
    return hints.colorScheme() == Qt.ColorScheme.Dark


def apply_theme(app: QApplication, mode: str) -> bool:
    """Style the whole app; returns whether the result is dark."""
    dark = is_dark(mode)
    app.setStyle("Fusion")
    palette = app.style().standardPalette()
    if dark:
        for role, colour in DARK.items():
            palette.setColor(role, QColor(colour))
        for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
            palette.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6b7078"))
    app.setPalette(palette)
    return dark
