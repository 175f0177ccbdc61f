"""What the screenshot scripts share: the real window on the embedded model with a
temporary history, and taking the picture then closing."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.settings import Settings
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread


def open_window(
    settings: Settings, on_loaded: Callable[[], None]
) -> tuple[QApplication, MainWindow]:
    """A 1280x800 window with a fresh history; ``on_loaded`` runs once the model is in."""
    app = QApplication(sys.argv[:1])
    store = Store(Path(tempfile.mkdtemp()) / "history.sqlite3")
    window = MainWindow(WorkerThread(), store, settings)
    window.resize(1280, 800)
    window.show()
    window.worker.results.model_loaded.connect(lambda _name: QTimer.singleShot(200, on_loaded))
    return app, window


def shoot_memory_at(app: QApplication, window: MainWindow, needle: str, out: Path) -> None:
    """Scroll the Memory view to the first ``needle`` in the document, then ``shoot``."""
    view = window.memory_view
    text = view.text.toPlainText()
    at = text.find(needle, text.find("── document"))
    view.scroll_to(at / max(len(text), 1))
    QTimer.singleShot(700, lambda: shoot(app, window, out))


def shoot(app: QApplication, window: MainWindow, out: Path) -> None:
    """Save the window to ``out``, stop any work, then close and quit."""
    window.grab().save(str(out))
    print(f"wrote {out}")
    window.stop()
    QTimer.singleShot(500, window.close)
    QTimer.singleShot(1500, app.quit)
