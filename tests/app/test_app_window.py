"""The main window with a fake engine: documents, streaming answers, policy switch,
errors that leave the app usable, graphs that receive samples, history on reopen;
the KV graph's label against llama.cpp's default cache, from hand-made stats."""

from __future__ import annotations

import pytest
from helpers.fakes import FakeEngine, RecordingEngine

from app.graphs import MemoryGraphs
from app.settings import Settings
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread
from engine.stats import KVStats


@pytest.fixture
def window(qtbot, tmp_path):
    engine = RecordingEngine()
    wt = WorkerThread(lambda path, layers, threads: engine)
    store = Store(tmp_path / "h.sqlite3")
    w = MainWindow(wt, store, Settings())
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.model_name == "Fake 1B", timeout=5000)
    w.engine = engine
    yield w
    w.close()


def _wait_idle(qtbot, w):
    """Until the answer to the last user message is stored and the worker is idle."""

    def answered() -> bool:
        msgs = w.store.messages(w.conversation.id) if w.conversation else []
        return bool(msgs) and msgs[-1].role == "assistant" and w.send_button.isEnabled()

    qtbot.waitUntil(answered, timeout=5000)


def test_attach_and_summarize_streams_into_the_chat(qtbot, window, tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("Clara repaired the bicycle. " * 50)
    assert window.attach(doc)
    assert "notes.txt" in window.doc_label.text()
    window.summarize()
    _wait_idle(qtbot, window)
    text = window.chat.toPlainText()
    assert "Summarize notes.txt" in text and "Forty-two" in text  # the cue taken off
    assert len(window.graphs.samples) >= 4
    assert "fake" in text  # the footer names the policy that answered


def test_policy_switch_applies_to_the_next_message(qtbot, window):
    window.input.setPlainText("first?")
    window.send()
    _wait_idle(qtbot, window)
    window.panel.set_policy("h2o")
    window.input.setPlainText("second?")
    window.send()
    _wait_idle(qtbot, window)
    assert window.engine.policies == ["snapkv", "h2o"]
    assert "H2O" in window.status_line.text()


def test_bad_file_shows_an_error_and_the_app_stays_usable(qtbot, window, tmp_path):
    bad = tmp_path / "blob.pdf"
    bad.write_bytes(b"not a pdf")
    assert not window.attach(bad)
    assert "not a readable PDF" in window.error.text()
    window.input.setPlainText("still there?")
    window.send()
    _wait_idle(qtbot, window)
    assert "forty-two" in window.chat.toPlainText()


def test_history_survives_reopening(qtbot, tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    wt = WorkerThread(lambda path, layers, threads: FakeEngine())
    w = MainWindow(wt, store, Settings())
    qtbot.addWidget(w)
    w.input.setPlainText("remember me")
    w.send()
    _wait_idle(qtbot, w)
    w.close()
    store.close()
    store2 = Store(tmp_path / "h.sqlite3")
    w2 = MainWindow(WorkerThread(lambda path, layers, threads: FakeEngine()), store2, Settings())
    qtbot.addWidget(w2)
    assert "remember me" in w2.chat.toPlainText() and "forty-two" in w2.chat.toPlainText()
    w2.close()


def test_settings_persist_and_sidebar_actions(qtbot, tmp_path):
    from app.settings import load

    path = tmp_path / "settings.json"
    store = Store(tmp_path / "h.sqlite3")
    w = MainWindow(WorkerThread(lambda p, layers, t: FakeEngine()), store, Settings(), path)
    qtbot.addWidget(w)
    w.panel.set_policy("tova")
    w.panel.budget.setValue(2048)
    assert load(path).policy == "tova" and load(path).budget_tokens == 2048
    assert "No NVIDIA GPU" in w.graphs.memory_label.text()
    w.input.setPlainText("keep this")
    w.send()
    _wait_idle(qtbot, w)
    w.rename_chat("Renamed chat")
    assert w.conversations.currentItem().text() == "Renamed chat"
    out = tmp_path / "chat.md"
    w.export_chat(out)
    assert out.read_text().startswith("# Renamed chat") and "keep this" in out.read_text()
    w.delete_chat()  # the last chat: a new one is shown, not saved
    assert store.conversations() == [] and w.conversation is None
    assert w.conversations.count() == 1 and w.conversations.item(0).text() == "New chat"
    w.close()


def _kv(tokens_seen: int, cells_used: int, kv_type: str = "f16") -> KVStats:
    """Gemma-3-270M-like figures: a 1024-token budget, 5 of 6 layers windowed (512)."""
    return KVStats(
        policy="snapkv",
        budget_tokens=1024,
        n_ctx=1280,
        kv_bytes_per_cell=18432,
        kv_bytes_per_cell_swa=15360,
        n_swa=512,
        swa_cells=768,
        kv_type=kv_type,
        tokens_seen=tokens_seen,
        cells_used=cells_used,
    )


def test_kv_graph_states_the_saving_against_llama_cpp_default(qtbot):
    g = MemoryGraphs()
    qtbot.addWidget(g)
    # held 1280 x 3 KiB + 768 x 15 KiB = 15 MB; llama.cpp's default for 10,000 tokens:
    # 10,240 x 3 KiB + 1,024 x 15 KiB = 45 MB; every layer a cell per token: 175.8 MB
    g.add(_kv(10_000, 1_024))
    text = g.saving.text()
    assert text.startswith("<b>Saving 30.0 MB</b>: the cache holds 15.0 MB")
    assert "llama.cpp's default cache would hold 45.0 MB (3.0x)" in text
    assert "every layer at full length: 175.8 MB" in text
    assert "1,024 of 10,000 tokens kept." in text and "Cache type" not in text
    assert text.index("llama.cpp") < text.index("full length")  # the honest baseline first
    assert g.samples[-1][1:4] == (15.0, 45.0, 184_320_000 / 2**20)
    assert [len(c.getData()[1]) for c in (g.kv_held, g.kv_default, g.kv_full)] == [1, 1, 1]
    legend = g.kv_legend.text().replace("&nbsp;", " ")
    names = ["held", "llama.cpp default", "swa_full (every layer)"]
    assert [legend.index(name) for name in names] == sorted(legend.index(n) for n in names)


def test_kv_graph_says_no_saving_when_the_cache_is_larger(qtbot):
    g = MemoryGraphs()
    qtbot.addWidget(g)
    # 300 tokens: llama.cpp's default would allocate 512 cells in every layer, 9 MB
    g.add(_kv(300, 300, kv_type="q8_0/f16"))
    text = g.saving.text()
    assert "Saving" not in text
    assert text.startswith("<b>No saving yet</b>: the cache holds 15.0 MB for 300 tokens")
    assert "llama.cpp's default would hold 9.0 MB" in text
    assert "Cache type: K q8_0, V f16" in text
    g.clear()
    assert not g.samples
    g.add(_kv(0, 0))
    assert "no tokens read yet" in g.saving.text()


def test_the_file_dialog_offers_every_type_the_cli_reads():
    """One list of document types (issue 21): the app's dialog once lacked .markdown,
    .rst, .csv and .log, which the CLI reads."""
    from app.window import DOCUMENT_TYPES
    from engine.documents.load import SUFFIXES

    offered = DOCUMENT_TYPES[DOCUMENT_TYPES.index("(") + 1 : -1].split()
    assert sorted(offered) == sorted(f"*{s}" for s in SUFFIXES)
    assert {"*.markdown", "*.rst", "*.csv", "*.log"} <= set(offered)
