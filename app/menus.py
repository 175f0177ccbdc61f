"""The menu bar: File (New chat, Attach…, Export…, Quit) and Help (About)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMessageBox

ABOUT = (
    "<p><b>kvtrim</b> {version}</p>"
    "<p>Chat with long documents on a small model: the KV cache stays within a fixed "
    "budget while eviction policies (StreamingLLM, H2O, SnapKV, TOVA) choose what the "
    "model keeps, and follow-up questions bring evicted passages back.</p>"
    "<p>Runs llama.cpp through llama-cpp-python; conversations stay on this computer.</p>"
)


def version() -> str:
    try:
        return metadata.version("kvtrim")
    except metadata.PackageNotFoundError:  # run from a source tree
        return "(source)"


def build_menus(
    window: QMainWindow,
    *,
    new_chat: Callable[[], None],
    attach: Callable[[], None],
    export: Callable[[], None],
) -> dict[str, QAction]:
    """Adds the menus to ``window``; returns their actions by name (for tests)."""
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    actions: dict[str, QAction] = {}
    entries = (
        ("new", "&New chat", "Ctrl+N", new_chat),
        ("attach", "&Attach…", "Ctrl+O", attach),
        ("export", "&Export…", "Ctrl+S", export),
        ("quit", "&Quit", "Ctrl+Q", window.close),  # Ctrl is Cmd on macOS
    )
    for name, text, keys, slot in entries:
        if name == "quit":
            file_menu.addSeparator()
        action = file_menu.addAction(text)
        action.setShortcut(QKeySequence(keys))
        action.triggered.connect(lambda _checked=False, slot=slot: slot())
        actions[name] = action
    help_menu = bar.addMenu("&Help")
    about = help_menu.addAction("&About kvtrim")
    about.triggered.connect(
        lambda: QMessageBox.about(window, "About kvtrim", ABOUT.format(version=version()))
    )
    actions["about"] = about
    return actions
