"""FAIL 12 of issue 23: the app's data folder path is a file. The app opens with its
history in memory and says why in one line, instead of dying with FileExistsError."""

from __future__ import annotations

from helpers.fakes import RecordingEngine

from app.settings import Settings
from app.store import Store, open_store
from app.window import MainWindow
from app.worker import WorkerThread


def test_a_data_folder_that_is_a_file_gives_an_in_memory_history(tmp_path):
    blocker = tmp_path / "kvtrim"
    blocker.write_text("not a folder")
    store, problem = open_store(blocker / "history.sqlite3")
    assert isinstance(store, Store) and problem is not None
    assert problem.startswith("History is not saved this time:") and str(blocker) in problem
    conversation = store.new_conversation("a chat")
    store.add_message(conversation.id, "user", "hello")
    assert [m.content for m in store.messages(conversation.id)] == ["hello"]
    store.close()


def test_a_usable_path_opens_the_history_on_disk(tmp_path):
    store, problem = open_store(tmp_path / "data" / "history.sqlite3")
    assert problem is None and (tmp_path / "data" / "history.sqlite3").exists()
    store.close()


def test_settings_that_cannot_be_saved_are_a_message_not_a_traceback(qtbot, tmp_path):
    blocker = tmp_path / "config"
    blocker.write_text("not a folder")
    engine = RecordingEngine()
    store, _ = open_store(tmp_path / "h.sqlite3")
    worker = WorkerThread(lambda path, layers, threads: engine)
    w = MainWindow(worker, store, Settings(), blocker / "s.json")
    qtbot.addWidget(w)
    w._settings_changed()
    assert w.error.text().startswith("Settings are not saved:")
    w.close()
    store.close()
