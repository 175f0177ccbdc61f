"""The main window: conversations, chat over documents, settings, live graphs.

Widgets hold no inference logic: requests go to the engine worker as queued
signals (``answering.Answering`` builds them and follows their events), and its
events come back through the worker thread's relay. Each chat's view is its own:
a new chat or another one shows no error, memory map or graph of the last.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import (
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QKeySequence,
    QShortcut,
)
from PySide6.QtWidgets import QApplication, QMainWindow, QSplitter

from engine import DocumentError
from engine.documents.load import load_document
from engine.native.monitor import MemoryMonitor
from engine.session.trace import MemoryMap

from . import dialogs
from .answering import Answering
from .chat_pane import ChatPane
from .dialogs import DOCUMENT_TYPES as DOCUMENT_TYPES
from .documents import Attached, joined, title_for
from .menus import build_menus
from .settings import Settings, save
from .sidebar import Sidebar
from .status import Status
from .store import Conversation, Message, Store
from .tabs import SideTabs
from .theme import apply_theme
from .worker import WorkerThread

SAMPLE_MS = 500  # graphs and memory refresh at 2 Hz while the app is open
MIN_SIZE = (960, 640)  # every control stays readable down to this
DEFAULT_SIZE = (1280, 800)
DEFAULT_SPLIT = [220, 640, 420]  # sidebar, chat, tabs


class MainWindow(QMainWindow):
    """Everything a user sees; ``worker`` runs the engine, ``store`` keeps history."""

    def __init__(
        self,
        worker: WorkerThread,
        store: Store,
        settings: Settings,
        settings_path: Path | None = None,
    ) -> None:
        super().__init__()
        self.worker, self.store, self.settings = worker, store, settings
        self.settings_path = settings_path
        self.monitor = MemoryMonitor()
        self.documents: list[Attached] = []  # the chat's documents, read
        self.busy = False
        self.conversation: Conversation | None = None  # None: a new chat, not saved yet
        self.answering = a = Answering(self)
        self.send, self.summarize, self.regenerate = a.send, a.summarize, a.regenerate
        self.copy_answer, self.stop = a.copy_answer, a.stop
        self.setWindowTitle("kvtrim")
        self.setAcceptDrops(True)
        self.setMinimumSize(*MIN_SIZE)
        self._build()
        self._connect()
        self._restore_geometry()
        self.apply_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.apply_theme)
        store.delete_empty()  # new chats left empty by earlier versions
        latest = store.conversations()
        self._select_conversation_id(latest[0].id if latest else None)
        self.timer = QTimer(self)
        self.timer.setInterval(SAMPLE_MS)
        self.timer.timeout.connect(self._tick)
        self.timer.start()
        self._tick()
        worker.requests.load_model.emit(
            settings.model_path or None, settings.gpu_layers, settings.threads or None
        )

    # -- layout -----------------------------------------------------------

    def _build(self) -> None:
        self.sidebar = Sidebar()
        self.conversations = self.sidebar.list
        self.delete_button = self.sidebar.delete_button
        self.pane = p = ChatPane(self._messages, self.send)
        self.doc_label, self.chat, self.progress, self.error = (
            p.doc_label,
            p.chat,
            p.progress,
            p.error,
        )
        self.input, self.send_button, self.stop_button = p.input, p.send_button, p.stop_button
        self.tabs = SideTabs(self.settings)
        self.panel, self.graphs = self.tabs.panel, self.tabs.graphs
        self.memory_view = self.tabs.memory_view
        self.split = QSplitter()
        self.split.setChildrenCollapsible(False)
        for w, stretch in ((self.sidebar, 1), (self.pane, 4), (self.tabs, 2)):
            self.split.addWidget(w)
            self.split.setStretchFactor(self.split.count() - 1, stretch)
        self.setCentralWidget(self.split)
        self.status = Status(self)
        self.status_line = self.status.label
        self.statusBar().addWidget(self.status_line, 1)
        self.menu_actions = build_menus(
            self, new_chat=self.new_chat, attach=self._pick_files, export=self._export
        )

    def _connect(self) -> None:
        r, a, p = self.worker.results, self.answering, self.pane
        r.model_loaded.connect(lambda name: self.status.update(model=name))
        r.cpu_path.connect(lambda text: self.status.update(cpu=text))
        r.notice.connect(lambda text: self.statusBar().showMessage(text, 15_000))
        r.notice.connect(self.error.setText)
        r.event.connect(a.on_event)
        r.memory_map.connect(self._on_memory_map)
        r.failed.connect(a.on_failed)
        r.cancelled.connect(a.on_cancelled)
        r.busy.connect(self._on_busy)
        r.saved.connect(self.status.saved)
        self.pane.switch_note.keep_button.clicked.connect(self._keep_settings)
        for button, slot in (
            (p.send_button, self.send),
            (p.summarize_button, self.summarize),
            (p.regenerate_button, self.regenerate),
            (p.copy_button, self.copy_answer),
            (p.stop_button, self.stop),
            (p.attach_button, self._pick_files),
            (p.detach_button, self.detach),
        ):
            button.clicked.connect(slot)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.rename_requested.connect(self._rename)
        self.sidebar.delete_requested.connect(self.delete_chat)
        self.sidebar.export_requested.connect(self._export)
        self.sidebar.selected.connect(self._select_conversation_id)
        self.panel.changed.connect(self._settings_changed)
        self.panel.reload_requested.connect(self._reload_model)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.stop)

    def _restore_geometry(self) -> None:
        """The size, place and splitter of the last close, else the defaults."""
        s = self.settings
        if not s.window_geometry or not self.restoreGeometry(
            QByteArray.fromBase64(s.window_geometry.encode("ascii"))
        ):
            self.resize(*DEFAULT_SIZE)
        self.split.setSizes(s.splitter_sizes or DEFAULT_SPLIT)

    def apply_theme(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            self.tabs.set_dark(apply_theme(app, self.settings.theme))

    # -- chats --------------------------------------------------------------

    def new_chat(self) -> None:
        """A new chat, saved once it holds a message."""
        self.worker.requests.forget.emit()
        self._select_conversation_id(None)

    def ensure_conversation(self, first_message: str) -> int:
        """The shown chat's id; a new one is saved now, with its documents."""
        if self.conversation is None:
            self.conversation = self.store.new_conversation(title_for(first_message) or "Chat")
            for doc in self.documents:
                self.store.add_document(self.conversation.id, doc.path)
            self._refresh_conversations()
        return self.conversation.id

    def attach(self, path: Path, *, remember: bool = True) -> bool:
        """Read a document; a bad file shows its reason and changes nothing."""
        try:
            text = load_document(path)
        except DocumentError as exc:
            self.error.setText(str(exc))
            return False
        self.documents.append(Attached(path.name, text, path))
        if remember and self.conversation is not None:
            self.store.add_document(self.conversation.id, path)
        self._show_documents()
        self.error.clear()
        return True

    def detach(self) -> None:
        """Forget the documents for the next messages (history keeps their names)."""
        self.documents = []
        self._show_documents()

    def document_text(self) -> str:
        return joined(self.documents)

    def rename_chat(self, title: str) -> None:
        if self.conversation is not None and title.strip():
            self.store.rename(self.conversation.id, title)
            self._refresh_conversations()

    def delete_chat(self) -> None:
        if self.conversation is None or self.busy:
            return
        self.store.delete(self.conversation.id)
        self.tabs.forget(self.conversation.id)
        self.worker.requests.delete_chat.emit(self.conversation.id)
        self.status.caches.forget(self.conversation.id)
        rest = self.store.conversations()
        self._select_conversation_id(rest[0].id if rest else None)

    def export_chat(self, path: Path) -> None:
        if self.conversation is not None:
            path.write_text(self.store.export_markdown(self.conversation.id), encoding="utf-8")

    def _select_conversation_id(self, cid: int | None) -> None:
        """Show a conversation (None: a new one) with its own documents, and nothing of
        the last one's: no error, progress, memory map or graph; a moved file is said."""
        self.conversation = next((c for c in self.store.conversations() if c.id == cid), None)
        self.documents = []
        self.error.clear()
        self.progress.setVisible(False)
        self.tabs.show_chat(cid if self.conversation else None)
        if self.conversation is not None:
            for doc in self.store.documents(self.conversation.id):
                if not self.attach(Path(doc.path), remember=False):
                    self.error.setText(f"{doc.name} could not be opened again: {self.error.text()}")
        self._show_documents()
        self._refresh_conversations()
        if self.conversation is not None:
            self.worker.requests.report_saved.emit(self.conversation.id)
        self.status.chat_shown()

    # -- dialogs ------------------------------------------------------------

    def _rename(self) -> None:
        if self.conversation is not None:
            title = dialogs.ask_title(self, self.conversation.title)
            if title is not None:
                self.rename_chat(title)

    def _export(self) -> None:
        """Save as Markdown, offering the chat's title as the file name."""
        if self.conversation is None:
            self.statusBar().showMessage("Nothing to export: the chat is empty.", 3000)
        elif (path := dialogs.ask_export_path(self, self.conversation.title)) is not None:
            self.export_chat(path)
            self.statusBar().showMessage(f"Exported to {path}", 5000)

    def _pick_files(self) -> None:
        for path in dialogs.ask_documents(self):
            self.attach(path)

    # -- settings and the worker's results ------------------------------------

    def _settings_changed(self) -> None:
        self.status.settings_changed()
        self._save_settings()
        self.apply_theme()

    def _keep_settings(self) -> None:
        self.status.keep_settings()
        self._save_settings()

    def _save_settings(self) -> None:
        if self.settings_path is not None:
            try:
                save(self.settings, self.settings_path)
            except OSError as exc:  # the config folder is a file, or read-only
                self.error.setText(f"Settings are not saved: {self.settings_path}: {exc}")

    def _reload_model(self, path: str | None, layers: int, threads: int | None) -> None:
        self.status.update(model="loading model…")
        self.worker.requests.load_model.emit(path, layers, threads)

    def _tick(self) -> None:
        """2 Hz: memory sample, and the KV graphs move on while the shown chat's job runs."""
        self.graphs.add_memory(self.monitor.sample())
        if self.busy and self.answering.visible and self.graphs.last is not None:
            self.graphs.add(self.graphs.last)

    def _on_memory_map(self, memory_map: MemoryMap) -> None:
        if (cid := self.answering.conversation) is not None:
            self.tabs.add_map(cid, memory_map, shown=self.answering.visible)

    def _on_busy(self, busy: bool) -> None:
        """While the engine works: Stop only, no model change, no deleting the chat."""
        self.busy = busy
        self.pane.set_busy(busy)
        self.panel.set_busy(busy)
        self.delete_button.setEnabled(not busy)

    # -- view -------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.status.model_name

    def shown_chat(self) -> int | None:
        return self.conversation.id if self.conversation else None

    def _show_documents(self) -> None:
        chars = sum(len(d.text) for d in self.documents)
        self.pane.show_documents([d.name for d in self.documents], chars)
        self.render()

    def _refresh_conversations(self) -> None:
        current = self.conversation.id if self.conversation else None
        self.sidebar.show_conversations(self.store.conversations(), current)

    def _messages(self) -> list[Message]:
        return self.store.messages(self.conversation.id) if self.conversation else []

    def render(self) -> None:
        """The shown chat, with the answer being written if it belongs to this chat."""
        self.chat.pending = self.answering.pending if self.answering.visible else None
        self.chat.render()

    # -- drag and drop, close ----------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.attach(Path(url.toLocalFile()))
        event.acceptProposedAction()

    def closeEvent(self, event: QCloseEvent) -> None:
        """Remember the window's size and splitter, then stop the engine."""
        self.settings.window_geometry = bytes(self.saveGeometry().toBase64().data()).decode()
        self.settings.splitter_sizes = self.split.sizes()
        self._save_settings()
        self.timer.stop()
        self.chat.stop()
        self.worker.stop()
        self.monitor.close()
        super().closeEvent(event)
