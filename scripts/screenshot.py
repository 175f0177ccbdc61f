"""Screenshot of the real window in the middle of reading a long document.

    xvfb-run -s "-screen 0 1280x800x24" .venv/bin/python scripts/screenshot.py docs/app.png

Uses the embedded model and a temporary history; the shot is taken while the
document is still being read, so the graphs show the cache held flat against
what a full cache would need.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.settings import Settings
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread
from engine import Progress

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/app.png")
    app = QApplication(sys.argv[:1])
    store = Store(Path(tempfile.mkdtemp()) / "history.sqlite3")
    window = MainWindow(WorkerThread(), store, Settings(budget_tokens=1024))
    window.resize(1280, 800)
    window.show()
    seen = {"progress": 0}

    def start() -> None:
        window.attach(ROOT / "resources" / "samples" / "passkey.txt")
        window.input.setPlainText("What is the pass key?")
        window.send()

    def on_event(event: object) -> None:
        if isinstance(event, Progress):
            seen["progress"] += 1
            if seen["progress"] == 26:
                QTimer.singleShot(300, shoot)

    def shoot() -> None:
        window.grab().save(str(out))
        print(f"wrote {out}")
        window.stop()
        QTimer.singleShot(500, window.close)
        QTimer.singleShot(1500, app.quit)

    window.worker.results.event.connect(on_event)
    window.worker.results.model_loaded.connect(lambda _name: QTimer.singleShot(200, start))
    app.exec()


if __name__ == "__main__":
    main()
