"""A conversation resumes from its saved compressed cache (issue 22): drop a
document, summarize it, ask two follow-ups, close the app, open it again and ask a
third: the third is answered from the saved cache (no document read) and is the same
answer the running app gave; Regenerate restarts the answer from its saved start. A
settings change or a damaged file reads again with the reason. Real model."""

from __future__ import annotations

import pytest
from helpers.docs_for_tests import prose

from app.settings import Settings
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread
from engine import Progress, Restored
from engine.runtime.states import StateStore

pytestmark = pytest.mark.slow

FACT = "The harbour master's boat is called Seraphine."
DOC = prose(50, seed=21) + f" {FACT} " + prose(50, seed=22)
SETTINGS = dict(policy="snapkv", budget_tokens=256, max_tokens=16, answer_prefix="")


def _open(qtbot, tmp_path, **changes) -> tuple[MainWindow, list]:
    store = Store(tmp_path / "h.sqlite3")
    states = StateStore(tmp_path / "states")
    w = MainWindow(WorkerThread(states=states), store, Settings(**{**SETTINGS, **changes}))
    qtbot.addWidget(w)
    events: list = []
    w.worker.results.event.connect(events.append)
    qtbot.waitUntil(lambda: w.model_name == "Gemma 3 270m" and not w.busy, timeout=60_000)
    return w, events


def _ask(qtbot, w: MainWindow, question: str) -> str:
    w.input.setPlainText(question)
    w.send()
    qtbot.waitUntil(lambda: not w.answering.running, timeout=120_000)
    return w.store.messages(w.conversation.id)[-1].content


def _close(w: MainWindow) -> None:
    w.close()
    w.store.close()


def test_a_restarted_app_answers_from_the_saved_cache(qtbot, tmp_path):
    doc = tmp_path / "harbour.txt"
    doc.write_text(DOC)
    w, events = _open(qtbot, tmp_path)
    assert w.attach(doc)
    w.summarize()
    qtbot.waitUntil(lambda: not w.answering.running, timeout=120_000)
    _ask(qtbot, w, "What is the harbour master's boat called?")
    _ask(qtbot, w, "Who sold the kettle?")
    qtbot.waitUntil(lambda: "cache saved" in w.status_line.text(), timeout=10_000)
    saved = w.status.caches.sizes[w.conversation.id]
    assert saved > 1 << 20
    kept = {p.name: p.read_bytes() for p in (tmp_path / "states").iterdir()}
    third = "Who repaired the bicycle?"
    live = _ask(qtbot, w, third)  # the running app's answer to the third question
    cid = w.conversation.id
    # back to the app as it closed after the second question: its messages and caches
    for message in w.store.messages(cid)[-2:]:
        w.store.delete_message(message.id)
    _close(w)
    for name, data in kept.items():
        (tmp_path / "states" / name).write_bytes(data)

    w, events = _open(qtbot, tmp_path)
    assert w.conversation.id == cid
    again = _ask(qtbot, w, third)
    restored = [e for e in events if isinstance(e, Restored)]
    reads = [e for e in events if isinstance(e, Progress) and e.total > 200]
    assert restored and not restored[0].reason and not reads, (restored, reads)
    assert again == live

    before = w.store.messages(cid)[-1]
    events.clear()
    w.regenerate()
    qtbot.waitUntil(lambda: not w.answering.running, timeout=120_000)
    assert [e for e in events if isinstance(e, Restored)]  # from the answer's saved start
    assert not [e for e in events if isinstance(e, Progress)]
    after = w.store.messages(cid)[-1]
    assert after.id == before.id and after.role == "assistant"
    _close(w)


def test_other_settings_or_a_damaged_file_read_again_and_say_why(qtbot, tmp_path):
    doc = tmp_path / "harbour.txt"
    doc.write_text(DOC)
    w, _ = _open(qtbot, tmp_path)
    assert w.attach(doc)
    _ask(qtbot, w, "What is the harbour master's boat called?")
    qtbot.waitUntil(lambda: "cache saved" in w.status_line.text(), timeout=10_000)
    _close(w)

    for folder in (tmp_path / "states").iterdir():
        folder.write_bytes(folder.read_bytes()[:1000])  # truncated
    w, events = _open(qtbot, tmp_path)
    notices: list[str] = []
    w.worker.results.notice.connect(notices.append)
    _ask(qtbot, w, "Who sold the kettle?")
    assert any("Reading the document again" in n and "damaged" in n for n in notices), notices
    assert [e for e in events if isinstance(e, Progress) and e.total > 200]  # read again
    _close(w)

    w, events = _open(qtbot, tmp_path, budget_tokens=512)
    notices = []
    w.worker.results.notice.connect(notices.append)
    _ask(qtbot, w, "Who repaired the bicycle?")
    assert any("other settings" in n for n in notices), notices
    _close(w)
