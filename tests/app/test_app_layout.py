"""Issue 22, finding 3: every control readable at 1024x700, the window's size and
splitter remembered, chat titles elided, a new chat saved only with a message, each
chat's view its own, the export named after the chat, Copy answer confirmed,
StreamingLLM's window explained, the menu bar."""

from __future__ import annotations

import pytest
from helpers.app_windows import open_window as _window
from helpers.fakes import FakeEngine
from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QApplication,
    QComboBox,
    QFileDialog,
    QLabel,
    QStyle,
    QStyleOptionComboBox,
)

from app.settings import load
from app.window import MainWindow


def _ask(qtbot, w: MainWindow, text: str) -> None:
    w.input.setPlainText(text)
    w.send()
    qtbot.waitUntil(lambda: not w.busy and w.answering.pending is None, timeout=5000)


def _needed(combo: QComboBox) -> int:
    """The width a combo box needs to show its current item whole."""
    option = QStyleOptionComboBox()
    combo.initStyleOption(option)
    text = QSize(combo.fontMetrics().horizontalAdvance(combo.currentText()), 10)
    return (
        combo.style().sizeFromContents(QStyle.ContentsType.CT_ComboBox, option, text, combo).width()
    )


def _cut(widget) -> list[str]:
    """Visible buttons, combo boxes and one-line labels narrower than their text needs."""
    out = []
    for button in widget.findChildren(QAbstractButton):
        if button.isVisible() and button.width() < button.minimumSizeHint().width():
            out.append(button.text())
    for combo in widget.findChildren(QComboBox):
        if combo.isVisible() and combo.width() < _needed(combo):
            out.append(combo.currentText())
    for label in widget.findChildren(QLabel):
        one_line = label.isVisible() and not label.wordWrap() and label.text()
        if one_line and label.width() < label.minimumSizeHint().width():
            out.append(label.text())
    return out


@pytest.mark.parametrize("size", [(1024, 700), (960, 640)])
def test_every_control_is_whole_at_1024x700_and_the_minimum(qtbot, tmp_path, size):
    w = _window(qtbot, tmp_path)
    assert (w.minimumWidth(), w.minimumHeight()) == (960, 640)
    w.resize(*size)
    w.show()
    qtbot.waitExposed(w)
    assert (w.width(), w.height()) == size
    for index in range(w.tabs.count()):
        w.tabs.setCurrentIndex(index)
        qtbot.wait(50)
        assert _cut(w) == [], w.tabs.tabText(index)
    scroll = w.tabs.widget(2)  # Settings: no sideways scrolling
    assert not scroll.horizontalScrollBar().isVisible()
    assert w.panel.width() <= scroll.viewport().width()
    assert w.panel.found_models.currentText() in ("None found", "Not looked yet") or (
        w.panel.found_models.currentText().startswith("Choose one of")
    )
    w.close()


def test_window_size_and_splitter_are_remembered(qtbot, tmp_path, monkeypatch):
    # the offscreen screen is 800x800, and a restored window is kept on its screen
    monkeypatch.setattr("app.window.MIN_SIZE", (600, 400))
    path = tmp_path / "settings.json"
    w = _window(qtbot, tmp_path, path=path)
    w.resize(760, 520)
    w.show()
    qtbot.waitExposed(w)
    w.split.setSizes([150, 380, 210])
    sizes = w.split.sizes()
    w.close()
    saved = load(path)
    assert saved.window_geometry and saved.splitter_sizes == sizes
    again = _window(qtbot, tmp_path / "again", settings=saved, path=path)
    again.show()
    qtbot.waitExposed(again)
    assert (again.width(), again.height()) == (760, 520)
    assert again.split.sizes() == sizes
    again.close()


def test_long_titles_are_elided_with_the_whole_title_as_tooltip(qtbot, tmp_path):
    w = _window(qtbot, tmp_path)
    question = "What does the long document say about the history of the Roman aqueducts? " * 3
    _ask(qtbot, w, question)
    item = w.conversations.currentItem()
    assert item.text() == w.conversation.title and item.toolTip() == item.text()
    assert item.text().endswith("…") and len(item.text()) <= 80
    assert w.conversations.textElideMode() == Qt.TextElideMode.ElideRight
    assert w.conversations.horizontalScrollBarPolicy() == Qt.ScrollBarPolicy.ScrollBarAlwaysOff
    w.close()


def test_a_new_chat_is_saved_only_with_its_first_message(qtbot, tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("Clara repaired the bicycle.")
    w = _window(qtbot, tmp_path)
    assert w.conversation is None and w.store.conversations() == []
    w.new_chat()
    assert w.attach(doc)
    assert w.store.conversations() == [] and w.conversations.item(0).text() == "New chat"
    _ask(qtbot, w, "Who repaired it?")
    [saved] = w.store.conversations()
    assert saved.title == "Who repaired it?"
    assert [d.name for d in w.store.documents(saved.id)] == ["notes.txt"]
    w.new_chat()
    w.new_chat()
    assert len(w.store.conversations()) == 1
    w.close()


def test_each_chat_view_is_its_own(qtbot, tmp_path):
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text("Clara repaired the bicycle.")
    second.write_text("Bob sold the kettle.")
    w = _window(qtbot, tmp_path, engine=FakeEngine(steps=500, delay=0.01))
    w.new_chat()
    assert w.attach(first)
    assert "Drop a document" not in w.chat.toPlainText()
    assert "first.txt attached" in w.chat.toPlainText()
    w.input.setPlainText("Who?")
    w.send()
    qtbot.waitUntil(lambda: len(w.graphs.samples) > 2, timeout=5000)
    w.stop()
    qtbot.waitUntil(lambda: not w.busy, timeout=5000)
    assert w.error.text() == "Stopped."
    w.memory_view.show_map(object())  # stands for the map the engine sent
    w.new_chat()
    assert w.error.text() == "" and not w.error.isVisible()
    assert not w.graphs.samples and w.graphs.saving.text() == "No document read yet."
    assert w.memory_view.map is None and w.memory_view.text.toPlainText() == ""
    assert w.attach(second)
    assert "second.txt attached" in w.chat.toPlainText() and "first" not in w.chat.toPlainText()
    w.close()


def test_switching_chats_leaves_the_stopped_line_behind(qtbot, tmp_path):
    w = _window(qtbot, tmp_path, engine=FakeEngine(steps=500, delay=0.01))
    w.input.setPlainText("Long?")
    w.send()
    qtbot.waitUntil(lambda: w.busy and len(w.graphs.samples) > 2, timeout=5000)
    w.stop()
    qtbot.waitUntil(lambda: not w.busy, timeout=5000)
    assert w.error.text() == "Stopped."
    stopped = w.conversation.id
    other = w.store.new_conversation("Another")
    w.store.add_message(other.id, "user", "hi")
    w._select_conversation_id(other.id)
    assert w.error.text() == "" and "Long?" not in w.chat.toPlainText()
    w._select_conversation_id(stopped)
    assert w.error.text() == ""
    w.close()


def test_export_offers_the_chat_title_as_the_file_name(qtbot, tmp_path, monkeypatch):
    w = _window(qtbot, tmp_path)
    _ask(qtbot, w, 'Report: "Q3/Q4" costs?')
    offered = []

    def save_dialog(parent, caption, proposed, filters):
        offered.append(proposed)
        return str(tmp_path / "out.md"), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", save_dialog)
    w.menu_actions["export"].trigger()
    assert offered and offered[0].endswith("Report Q3 Q4 costs.md")
    assert (tmp_path / "out.md").read_text().startswith("# Report:")
    from app.dialogs import export_name

    assert export_name('a/b\\c:d*e?f"g<h>i|j\x01') == "a b c d e f g h i j.md"
    assert export_name("...") == "chat.md" and len(export_name("x" * 300)) == 83
    w.close()


def test_copy_answer_confirms_and_the_status_line_comes_back(qtbot, tmp_path):
    w = _window(qtbot, tmp_path)
    _ask(qtbot, w, "what?")
    w.pane.copy_button.click()
    assert QApplication.clipboard().text() == "forty-two"
    assert w.statusBar().currentMessage() == "Answer copied to the clipboard."
    assert w.pane.copy_button.text() == "Copied ✓"
    qtbot.waitUntil(lambda: w.pane.copy_button.text() == "Copy answer", timeout=5000)
    qtbot.waitUntil(lambda: w.statusBar().currentMessage() == "", timeout=5000)
    assert w.status_line.text().startswith("Fake 1B · SnapKV · budget 1,024 tokens")
    w.close()


def test_streaming_llm_says_what_it_keeps(qtbot, tmp_path):
    w = _window(qtbot, tmp_path)
    w.panel.set_policy("streaming")
    note = w.panel.policy_params.note
    assert "recent" not in w.panel.params  # its score is recency: no window to set
    assert "recent window of 1,020 tokens" in note.text()
    w.panel.params["n_sink"].setValue(8)
    w.panel.budget.setValue(2048)
    assert "budget 2,048 minus 8 sinks = a recent window of 2,040" in note.text()
    assert dict(w.panel.policy_settings()) == {"n_sink": 8}  # what the engine gets
    w.panel.set_policy("snapkv")
    assert w.panel.params["recent"].value() == 32 and note.isHidden()
    w.panel.set_policy("full")
    assert w.panel.params == {} and "no parameters" in note.text()
    w.close()


def test_the_menu_bar(qtbot, tmp_path):
    w = _window(qtbot, tmp_path)
    menus = [a.text() for a in w.menuBar().actions()]
    assert menus == ["&File", "&Help"]
    file_menu = w.menuBar().actions()[0].menu()
    texts = [a.text() for a in file_menu.actions() if not a.isSeparator()]
    assert texts == ["&New chat", "&Attach…", "&Export…", "&Quit"]
    keys = {name: a.shortcut().toString() for name, a in w.menu_actions.items()}
    assert keys["new"] == "Ctrl+N" and keys["quit"] == "Ctrl+Q"
    assert w.menu_actions["about"].text() == "&About kvtrim"
    _ask(qtbot, w, "first")
    w.menu_actions["new"].trigger()
    assert w.conversation is None
    w.menu_actions["quit"].trigger()
    assert not w.isVisible()
