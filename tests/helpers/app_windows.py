"""The main window on a fake engine, opened as the app tests open it."""

from __future__ import annotations

from app.settings import Settings
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread
from helpers.fakes import FakeEngine


def open_window(qtbot, tmp_path, engine=None, settings=None, path=None) -> MainWindow:
    engine = engine or FakeEngine()
    w = MainWindow(
        WorkerThread(lambda p, layers, t: engine),
        Store(tmp_path / "h.sqlite3"),
        settings or Settings(),
        path,
    )
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.model_name == "Fake 1B", timeout=5000)
    return w
