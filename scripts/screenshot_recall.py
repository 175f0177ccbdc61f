"""Screenshot of the Memory view after a follow-up brought evicted text back.

    QT_QPA_PLATFORM=offscreen .venv/bin/python \
        scripts/screenshot_recall.py docs/recall.png

A 7,600-token real-text document with four planted facts (the benchmark's first
document), SnapKV at a 1,024-token budget: the summary first, then "What is the
access code for the archive?"; the Memory tab is shown scrolled to the passage
that was brought back.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _shot import open_window, shoot_memory_at
from PySide6.QtCore import QTimer

from app.settings import Settings
from engine import Done, Engine
from engine.bench import multiturn


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/recall.png")
    facts = multiturn.facts_for(0)
    with Engine() as eng:
        text = multiturn.document(eng, 7600, facts, offset=0)
    doc = Path(tempfile.mkdtemp()) / "report.txt"
    doc.write_text(text)
    fact = facts[1]
    settings = Settings(budget_tokens=1024, max_tokens=48, answer_prefix=fact.answer_prefix)
    app, window = open_window(settings, lambda: summarize())
    window.centralWidget().setSizes([170, 470, 640])
    turns = {"done": 0}

    def summarize() -> None:
        window.attach(doc)
        window.summarize()

    def on_event(event: object) -> None:
        if not isinstance(event, Done):
            return
        turns["done"] += 1
        if turns["done"] == 1:
            QTimer.singleShot(300, ask)
        else:
            window.tabs.setCurrentWidget(window.memory_view)
            QTimer.singleShot(1500, lambda: shoot_memory_at(app, window, fact.value, out))

    def ask() -> None:
        window.input.setPlainText(fact.question)
        window.send()

    window.worker.results.event.connect(on_event)
    app.exec()


if __name__ == "__main__":
    main()
