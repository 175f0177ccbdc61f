"""Screenshot of the real window in the middle of summarizing a long document.

    xvfb-run -s "-screen 0 1280x800x24" .venv/bin/python scripts/screenshot.py docs/app.png

Uses the embedded model and a temporary history. First a real exchange about
the bundled passkey sample (so the sidebar and chat show a finished answer and
its figures), then a new chat summarizing about 30,000 tokens of the Python
reference manual; the shot is taken while that document is still being read,
so the graphs show the cache held flat against what a full cache would need.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _shot import open_window, shoot
from PySide6.QtCore import QTimer

from app.settings import Settings
from engine import Done, Progress
from engine.bench.texts import window as reference_text

ROOT = Path(__file__).resolve().parents[1]
SHOOT_AT_TOKENS = 12_000


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/app.png")
    document = Path(tempfile.mkdtemp()) / "python-reference.txt"
    document.write_text(reference_text(0, 120_000), encoding="utf-8")
    app, window = open_window(Settings(budget_tokens=1024, max_tokens=48), lambda: ask())
    state = {"stage": "ask", "shot": False}

    def ask() -> None:
        window.attach(ROOT / "resources" / "samples" / "passkey.txt")
        window.input.setPlainText("What is the pass key?")
        window.send()

    def summarize() -> None:
        state["stage"] = "summarize"
        window.new_chat()
        window.attach(document)
        window.summarize()

    def on_event(event: object) -> None:
        if isinstance(event, Done) and state["stage"] == "ask":
            QTimer.singleShot(300, summarize)
        elif (
            isinstance(event, Progress)
            and state["stage"] == "summarize"
            and event.done >= SHOOT_AT_TOKENS
            and not state["shot"]
        ):
            state["shot"] = True
            QTimer.singleShot(600, lambda: shoot(app, window, out))

    window.worker.results.event.connect(on_event)
    app.exec()


if __name__ == "__main__":
    main()
