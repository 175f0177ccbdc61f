"""Screenshot of the Memory view after a needle question, in the real window.

    xvfb-run -a -s "-screen 0 1280x800x24" .venv/bin/python \
        scripts/screenshot_memory.py docs/memory.png

The bundled 9,200-token passkey sample, SnapKV at a 1,024-token budget, answer
prefix "The pass key is"; when the answer is done the Memory tab is shown,
scrolled to the key.
"""

from __future__ import annotations

import sys
from pathlib import Path

from _shot import open_window, shoot_memory_at
from PySide6.QtCore import QTimer

from app.settings import Settings
from engine import Done

ROOT = Path(__file__).resolve().parents[1]
KEY_LINE = "The pass key is"


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/memory.png")
    settings = Settings(budget_tokens=1024, max_tokens=16, answer_prefix=KEY_LINE)
    app, window = open_window(settings, lambda: ask())
    window.centralWidget().setSizes([170, 470, 640])

    def ask() -> None:
        window.attach(ROOT / "resources" / "samples" / "passkey.txt")
        window.input.setPlainText("What is the pass key?")
        window.send()

    def on_event(event: object) -> None:
        if isinstance(event, Done):
            window.tabs.setCurrentWidget(window.memory_view)
            QTimer.singleShot(1500, lambda: shoot_memory_at(app, window, KEY_LINE, out))

    window.worker.results.event.connect(on_event)
    app.exec()


if __name__ == "__main__":
    main()
