"""``kvtrim``: with no arguments the desktop app, otherwise the command line."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def run_app(argv: Sequence[str] = ()) -> int:
    """Open the main window; returns when it closes."""
    from PySide6.QtWidgets import QApplication

    from .settings import default_paths, load
    from .store import Store
    from .window import MainWindow
    from .worker import WorkerThread

    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    app.setApplicationName("kvtrim")
    settings_path, history_path = default_paths()
    store = Store(history_path)
    window = MainWindow(WorkerThread(), store, load(settings_path), settings_path)
    window.show()
    code = app.exec()
    store.close()
    return int(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return run_app()
    from engine.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
