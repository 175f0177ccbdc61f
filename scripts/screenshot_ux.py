"""Screenshots of issue 22's window: layout, answers as written, stages, graphs.

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/screenshot_ux.py docs

First a scripted engine (no model) for what does not depend on it:

- ``app-1024.png``: the window at 1024x700 with the Settings tab (StreamingLLM's
  window explained, nothing cut, no sideways scrolling);
- ``app-answers.png``: answers of every shape a model writes, shown as written
  (bare numbers, a list, code, a table, HTML-looking text).

Then the embedded model at 1600x1000, SnapKV at a 1,024-token budget, on the
bundled 9,200-token passkey sample: Summarize, then "What is the pass key?":

- ``app-stage.png``: the answer's stage while the document is read;
- ``app-1600.png``: both answers done, the Graphs tab;
- ``app-graphs.png``: the Graphs tab alone (both requests on one time axis).

``fake`` or ``real`` after the folder makes only that part.
"""

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
from engine import Done, Progress

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "resources" / "samples" / "passkey.txt"
STAGE_AT_TOKENS = 3000
ANSWERS = [
    ("What is the pass key?", "48213."),
    ("And the page it is on?", "27."),
    (
        "Which numbers did the text give?",
        "Two of them:\n\n1. 48213, the pass key\n2. 27, its page\n\nBoth are **numbers**; "
        "the key is in `passkey.txt`.",
    ),
    (
        "Show it as code and as a table.",
        "```python\nprint('<b>48213</b>')\n```\n\n| what | value |\n|---|---|\n"
        "| key | 48213 |\n| page | 27 |\n\nHTML such as <b>bold</b> or <script> stays text.",
    ),
]


class _Scripted:
    """Enough of an engine for the window to load; the history is already stored."""

    model_name = "scripted engine (no model)"

    def close(self) -> None:
        pass


def _history() -> Store:
    store = Store(Path(tempfile.mkdtemp()) / "history.sqlite3")
    chat = store.new_conversation("What is the pass key?")
    store.add_document(chat.id, SAMPLE)
    for question, answer in ANSWERS:
        store.add_message(chat.id, "user", question)
        meta = "21.4 tok/s · first token 0.3 s · SnapKV, budget 1,024 · end of answer"
        store.add_message(chat.id, "assistant", answer, meta)
    older = store.new_conversation(
        "A very long title that the sidebar ends with an ellipsis, whole in its tooltip"
    )
    store.add_message(older.id, "user", "hello")
    return store


def _fake_window(size: tuple[int, int], settings: Settings) -> MainWindow:
    window = MainWindow(WorkerThread(lambda *_: _Scripted()), _history(), settings)
    window._select_conversation_id(window.store.conversations()[-1].id)
    window.resize(*size)
    window.show()
    return window


def _shoot(window: MainWindow, out: Path, widget: object = None) -> None:
    (widget or window).grab().save(str(out))  # type: ignore[union-attr]
    print(f"wrote {out}")


def fake_shots(app: QApplication, folder: Path, then: Callable[[], None]) -> None:
    """app-1024.png and app-answers.png, then ``then``."""
    narrow = _fake_window((1024, 700), Settings(policy="streaming"))
    narrow.tabs.setCurrentIndex(2)
    scroll = narrow.tabs.widget(2)
    QTimer.singleShot(
        1000, lambda: scroll.ensureWidgetVisible(narrow.panel.params["recent"], 0, 160)
    )
    answers = _fake_window((1280, 800), Settings())
    answers.split.setSizes([200, 760, 320])

    def shoot() -> None:
        _shoot(narrow, folder / "app-1024.png")
        _shoot(answers, folder / "app-answers.png")
        for window in (narrow, answers):
            window.close()
        then()

    QTimer.singleShot(2000, shoot)


def real_shots(app: QApplication, folder: Path) -> None:
    """app-stage.png, app-1600.png and app-graphs.png on the embedded model."""
    settings = Settings(policy="snapkv", budget_tokens=1024, max_tokens=48)
    window = MainWindow(WorkerThread(), Store(Path(tempfile.mkdtemp()) / "h.sqlite3"), settings)
    window.resize(1600, 1000)
    window.show()
    state = {"done": 0, "stage": False}

    def summarize() -> None:
        window.attach(SAMPLE)
        window.summarize()

    def ask() -> None:
        window.input.setPlainText("What is the pass key?")
        window.send()

    def finish() -> None:
        _shoot(window, folder / "app-1600.png")
        _shoot(window, folder / "app-graphs.png", window.tabs)
        window.close()
        app.quit()

    def on_event(event: object) -> None:
        if isinstance(event, Progress) and event.done >= STAGE_AT_TOKENS and not state["stage"]:
            state["stage"] = True
            QTimer.singleShot(200, lambda: _shoot(window, folder / "app-stage.png"))
        elif isinstance(event, Done):
            state["done"] += 1
            QTimer.singleShot(1500, ask if state["done"] == 1 else finish)

    window.worker.results.event.connect(on_event)
    window.worker.results.model_loaded.connect(lambda _name: QTimer.singleShot(500, summarize))


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "docs")
    part = sys.argv[2] if len(sys.argv) > 2 else "all"
    app = QApplication(sys.argv[:1])
    if part == "fake":
        fake_shots(app, folder, app.quit)
    elif part == "real":
        real_shots(app, folder)
    else:
        fake_shots(app, folder, lambda: real_shots(app, folder))
    app.exec()


if __name__ == "__main__":
    main()
