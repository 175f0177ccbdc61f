"""``kvtrim``: with no arguments the desktop app, otherwise the command line."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from engine.native import crashlog
from engine.native.crashlog import CrashReport


def run_app(argv: Sequence[str] = (), crash: CrashReport | None = None) -> int:
    """Open the main window; returns when it closes. ``crash``: what the last run
    left, shown in the window."""
    from .platform_check import window_problem

    problem = window_problem()
    if problem is not None:  # Qt would abort: say what is missing, before it tries
        sys.stderr.write(f"kvtrim: error: {problem}\n")
        return 2
    from PySide6.QtWidgets import QApplication

    from .settings import default_paths, load
    from .store import open_store
    from .window import MainWindow
    from .worker import WorkerThread

    crashlog.phase(crashlog.QT_START)  # an abort now is Qt's, not llama.cpp's
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    app.setApplicationName("kvtrim")
    crashlog.phase(crashlog.RUNNING)
    from engine.runtime.states import StateStore

    settings_path, history_path = default_paths()
    store, problem = open_store(history_path)
    states = None if problem else StateStore(history_path.parent / "states")
    window = MainWindow(WorkerThread(states=states), store, load(settings_path), settings_path)
    notes = [problem] if problem else []
    if crash is not None:
        notes.append(crash.message()[:1].upper() + crash.message()[1:] + ".")
    if notes:
        window.error.setText(" ".join(notes))
    window.show()
    code = app.exec()
    store.close()
    return int(code)


def self_test(argv: Sequence[str] = ()) -> int:
    """``kvtrim --self-test [--model PATH] [--gpu-layers N] [--no-gui]``: the
    engine's check, then (unless ``--no-gui``) Qt and pyqtgraph offscreen."""
    import argparse
    import logging
    import os
    from pathlib import Path

    from engine.cli.selftest import main as engine_self_test

    parser = argparse.ArgumentParser(prog="kvtrim --self-test")
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the bundled model)")
    parser.add_argument("--gpu-layers", type=int, default=0, metavar="N", help="-1 or 99: all")
    parser.add_argument("--no-gui", action="store_true", help="skip the Qt check")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    code = engine_self_test(model=args.model, gpu_layers=args.gpu_layers)
    if args.no_gui:
        print("self-test passed" if code == 0 else "self-test failed")
        return code
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
    """The app with no arguments, else the command line. Either way a native crash
    leaves a log (engine/crashlog.py); the app, and the command line with
    ``--verbose``, report the last one at start."""
    args = list(sys.argv[1:] if argv is None else argv)
    crashlog.arm()
    if not args:
        return run_app(crash=crashlog.take_last_crash())
    if args[:1] == ["--self-test"]:
        return self_test(args[1:])
    if "--verbose" in args:
        report = crashlog.take_last_crash()
        if report is not None:
            sys.stderr.write(f"kvtrim: note: {report.message()}\n")
    from engine.cli.main import main as cli_main

    return cli_main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
