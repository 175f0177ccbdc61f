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


def self_test() -> int:
    """``kvtrim --self-test``: the engine's check, then Qt and pyqtgraph offscreen."""
    import logging
    import os

    from engine.selftest import main as engine_self_test

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    code = engine_self_test()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        import pyqtgraph as pg
        from PySide6.QtWidgets import QApplication

        app = QApplication.instance() or QApplication([sys.argv[0]])
        plot = pg.PlotWidget()
        plot.plot([0, 1, 2], [1, 3, 2])
        ok = not plot.grab().isNull()
        name = app.platformName() if isinstance(app, QApplication) else "?"
        print(f"Qt ({name}) and pyqtgraph: {'ok' if ok else 'could not draw'}")
    except Exception as exc:
        print(f"Qt check failed: {type(exc).__name__}: {exc}")
        ok = False
    print("self-test passed" if code == 0 and ok else "self-test failed")
    return 0 if code == 0 and ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return run_app()
    if args == ["--self-test"]:
        return self_test()
    from engine.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
