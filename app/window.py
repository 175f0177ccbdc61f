"""The main window: conversations, chat over documents, settings, live graphs.

Widgets hold no inference logic: requests go to the engine worker as queued
signals, and its events come back through the worker thread's relay.
"""

from __future__ import annotations

import random
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import DocumentError, Done, Evicted, Progress, Recalled, Token
from engine.documents.load import SUFFIXES, load_document
from engine.native.monitor import MemoryMonitor
from engine.policies import label as policy_label
from engine.runtime.spec import RequestSpec
from engine.session.sampling import Sampling
from engine.session.trace import MemoryMap

from .chat import ChatView, MessageInput
from .graphs import MemoryGraphs
from .memory_view import MemoryView
from .settings import Settings, save
from .settings_panel import SettingsPanel
from .sidebar import Sidebar
from .store import Message, Store
from .theme import apply_theme
from .worker import Job, WorkerThread

DOCUMENT_TYPES = (
    f"Documents ({' '.join('*' + suffix for suffix in SUFFIXES)})"  # what the CLI reads
)
SAMPLE_MS = 500  # graphs and memory refresh at 2 Hz while the app is open
REGENERATE_TEMPERATURE = 0.7


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
        self.documents: list[tuple[str, str]] = []  # (name, text) of the attached files
        self.answer = ""
        self.busy = False
        self.job_conversation: int | None = None  # where the running answer goes
        self.replacing: int | None = None  # the answer a regeneration replaces when done
        self.job_prefix = ""  # the answer prefix of the running job
        self.model_name = "loading model…"
        self.cpu_note = ""
        self.conversation = store.conversations()[0] if store.conversations() else None
        self.setWindowTitle("kvtrim")
        self.setAcceptDrops(True)
        self.resize(1280, 800)
        self._build()
        self._connect()
        self.apply_theme()
        QGuiApplication.styleHints().colorSchemeChanged.connect(self.apply_theme)
        self._select_conversation_id(self.conversation.id if self.conversation else None)
        self._refresh_conversations()
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
        self.sidebar = left = Sidebar()
        self.conversations = self.sidebar.list
        self.delete_button = self.sidebar.delete_button

        self.doc_label = QLabel()
        self.doc_label.setWordWrap(True)
        self.clear_docs_button = QPushButton("Detach")
        doc_row = QHBoxLayout()
        doc_row.addWidget(self.doc_label, 1)
        doc_row.addWidget(self.clear_docs_button)
        self.chat = ChatView(self._messages)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.error = QLabel()
        self.error.setStyleSheet("color: #e05545;")
        self.error.setWordWrap(True)
        self.input = MessageInput(self.send)
        self.attach_button = QPushButton("Attach…")
        self.summarize_button = QPushButton("Summarize")
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Answer the last question again, with sampling")
        self.copy_button = QPushButton("Copy answer")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons = QHBoxLayout()
        for b in (self.attach_button, self.summarize_button, self.regenerate_button):
            buttons.addWidget(b)
        buttons.addWidget(self.copy_button)
        buttons.addStretch(1)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        center = QWidget()
        cv = QVBoxLayout(center)
        cv.addLayout(doc_row)
        cv.addWidget(self.chat, 1)
        cv.addWidget(self.progress)
        cv.addWidget(self.error)
        cv.addWidget(self.input)
        cv.addLayout(buttons)

        self.panel = SettingsPanel(self.settings)
        self.graphs = MemoryGraphs()
        scroll = QScrollArea()
        scroll.setWidget(self.panel)
        scroll.setWidgetResizable(True)
        self.memory_view = MemoryView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.graphs, "Graphs")
        self.tabs.addTab(self.memory_view, "Memory")
        self.tabs.addTab(scroll, "Settings")

        split = QSplitter()
        for w, stretch in ((left, 1), (center, 4), (self.tabs, 2)):
            split.addWidget(w)
            split.setStretchFactor(split.count() - 1, stretch)
        split.setSizes([220, 640, 420])
        self.setCentralWidget(split)

    def _connect(self) -> None:
        r = self.worker.results
        r.model_loaded.connect(self._on_model)
        r.cpu_path.connect(self._on_cpu_path)
        r.notice.connect(lambda text: self.statusBar().showMessage(text, 15_000))
        r.notice.connect(self.error.setText)
        r.event.connect(self._on_event)
        r.memory_map.connect(self._on_memory_map)
        r.failed.connect(self._on_failed)
        r.cancelled.connect(self._on_cancelled)
        r.busy.connect(self._on_busy)
        self.send_button.clicked.connect(self.send)
        self.summarize_button.clicked.connect(self.summarize)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button.clicked.connect(self.copy_answer)
        self.stop_button.clicked.connect(self.stop)
        self.attach_button.clicked.connect(self._pick_files)
        self.clear_docs_button.clicked.connect(self.detach)
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.rename_requested.connect(self._rename_dialog)
        self.sidebar.delete_requested.connect(self.delete_chat)
        self.sidebar.export_requested.connect(self._export_dialog)
        self.sidebar.selected.connect(self._select_conversation_id)
        self.panel.changed.connect(self._settings_changed)
        self.panel.reload_requested.connect(self._reload_model)
        QShortcut(QKeySequence("Ctrl+N"), self, self.new_chat)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.stop)

    # -- the settings panel's widgets, for callers and tests --------------

    @property
    def policy(self):  # noqa: ANN201 - a QComboBox whose item data are policy names
        return self.panel.policy

    @property
    def budget(self):  # noqa: ANN201
        return self.panel.budget

    def apply_theme(self) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            dark = apply_theme(app, self.settings.theme)
            self.graphs.set_dark(dark)
            self.memory_view.set_dark(dark)

    # -- actions ----------------------------------------------------------

    def new_chat(self) -> None:
        self.conversation = self.store.new_conversation()
        self.worker.requests.forget.emit()
        self.documents = []
        self._refresh_conversations()
        self._show_documents()
        self._render()

    def attach(self, path: Path, *, remember: bool = True) -> bool:
        """Read a document; a bad file shows its reason and changes nothing."""
        try:
            text = load_document(path)
        except DocumentError as exc:
            self.error.setText(str(exc))
            return False
        if self.conversation is None:
            self.new_chat()
        assert self.conversation is not None
        self.documents.append((path.name, text))
        if remember:
            self.store.add_document(self.conversation.id, path)
        self._show_documents()
        self.error.clear()
        return True

    def detach(self) -> None:
        """Forget the documents for the next messages (history keeps their names)."""
        self.documents = []
        self._show_documents()

    def document_text(self) -> str:
        if len(self.documents) == 1:
            return self.documents[0][1]
        return "\n\n".join(f"# {name}\n\n{text}" for name, text in self.documents)

    def send(self) -> None:
        question = self.input.toPlainText().strip()
        if not question or self.busy:
            return
        self.input.clear()
        self._start("ask", question)

    def summarize(self) -> None:
        if not self.documents:
            self.error.setText("Attach a document first (drop a file or use Attach…).")
            return
        if not self.busy:
            names = ", ".join(name for name, _ in self.documents)
            self._start("summarize", f"Summarize {names}")

    def regenerate(self) -> None:
        """Answer the last question again, sampling this time; the new answer replaces
        the old one when it is complete (a Stop or an error keeps the old one)."""
        if self.busy or self.conversation is None:
            return
        messages = self.store.messages(self.conversation.id)
        if len(messages) < 2 or messages[-1].role != "assistant":
            return
        question = messages[-2].content
        kind = "summarize" if question.startswith("Summarize ") and self.documents else "ask"
        self._start(kind, question, replace=messages[-1].id)

    def copy_answer(self) -> None:
        if self.conversation is None:
            return
        answers = [m for m in self.store.messages(self.conversation.id) if m.role == "assistant"]
        if answers:
            QApplication.clipboard().setText(answers[-1].content)
            self.statusBar().showMessage("Answer copied.", 3000)

    def stop(self) -> None:
        self.worker.worker.cancel()

    def rename_chat(self, title: str) -> None:
        if self.conversation is not None and title.strip():
            self.store.rename(self.conversation.id, title)
            self._refresh_conversations()

    def delete_chat(self) -> None:
        if self.conversation is None or self.busy:
            return
        self.store.delete(self.conversation.id)
        self.worker.requests.forget.emit()
        rest = self.store.conversations()
        self._select_conversation_id(rest[0].id if rest else None)
        self._refresh_conversations()

    def export_chat(self, path: Path) -> None:
        if self.conversation is not None:
            path.write_text(self.store.export_markdown(self.conversation.id), encoding="utf-8")

    def _rename_dialog(self) -> None:
        if self.conversation is None:
            return
        title, ok = QInputDialog.getText(
            self, "Rename chat", "Title:", text=self.conversation.title
        )
        if ok:
            self.rename_chat(title)

    def _export_dialog(self) -> None:
        if self.conversation is None:
            return
        name, _ = QFileDialog.getSaveFileName(self, "Export chat", "chat.md", "Markdown (*.md)")
        if name:
            self.export_chat(Path(name))

    def _pick_files(self) -> None:
        names, _ = QFileDialog.getOpenFileNames(self, "Attach documents", "", DOCUMENT_TYPES)
        for name in names:
            self.attach(Path(name))

    def _settings_changed(self) -> None:
        if self.settings_path is not None:
            try:
                save(self.settings, self.settings_path)
            except OSError as exc:  # the config folder is a file, or read-only
                self.error.setText(f"Settings are not saved: {self.settings_path}: {exc}")
        self.apply_theme()
        self._update_status()

    def _reload_model(self, path: str | None, layers: int, threads: int | None) -> None:
        self.model_name = "loading model…"
        self._update_status()
        self.worker.requests.load_model.emit(path, layers, threads)

    def _history(self, before: int | None = None) -> tuple[tuple[str, str], ...]:
        """The conversation's (question, answer) pairs, up to message id ``before``."""
        assert self.conversation is not None
        pairs, question = [], None
        for m in self.store.messages(self.conversation.id):
            if before is not None and m.id >= before:
                break
            if m.role == "user":
                question = m.content
            elif m.role == "assistant" and question is not None:
                pairs.append((question, m.content))
                question = None
        return tuple(pairs)

    def _start(self, kind: str, user_text: str, *, replace: int | None = None) -> None:
        if self.conversation is None:
            self.new_chat()
        assert self.conversation is not None
        cid = self.conversation.id
        fresh = replace is not None
        self.replacing = replace
        if replace is None:
            history = self._history()
            self.store.add_message(cid, "user", user_text)
        else:
            asked = [m.id for m in self.store.messages(cid) if m.role == "user" and m.id < replace]
            history = self._history(before=asked[-1])
        if self.conversation.title == "New chat":
            self.store.rename(cid, user_text[:40])
            self._refresh_conversations()
        self.job_conversation = cid
        self.job_prefix = self.settings.answer_prefix if kind == "ask" else ""
        self.answer = f"{self.job_prefix} " if self.job_prefix else ""
        self.error.clear()
        self.graphs.start()
        self._render()
        s = self.settings
        self.worker.requests.run.emit(
            Job(
                kind,
                self.document_text(),
                user_text,
                RequestSpec(
                    policy=self.panel.policy_name(),
                    budget_tokens=self.budget.value(),
                    kv_type=self.panel.kv_type_name(),
                    policy_settings=self.panel.policy_settings(),
                    max_tokens=s.max_tokens,
                    sampling=Sampling(
                        temperature=max(s.temperature, REGENERATE_TEMPERATURE)
                        if fresh
                        else s.temperature,
                        seed=random.randrange(2**31) if fresh else None,
                    ),
                    answer_prefix=self.job_prefix,
                ),
                conversation=cid,
                history=history,
                system=s.system_prompt,
                fresh=fresh,
            )
        )

    # -- worker results ---------------------------------------------------

    def _tick(self) -> None:
        """2 Hz: memory sample, and the KV graphs move on while a job runs."""
        self.graphs.add_memory(self.monitor.sample())
        if self.busy and self.graphs.last is not None:
            self.graphs.add(self.graphs.last)

    def _on_memory_map(self, memory_map: MemoryMap) -> None:
        conversation = self.conversation.id if self.conversation else None
        if conversation is not None and conversation == self.job_conversation:
            self.memory_view.show_map(memory_map)

    def _on_model(self, name: str) -> None:
        self.model_name = name
        self._update_status()

    def _on_cpu_path(self, text: str) -> None:
        self.cpu_note = text
        self._update_status()

    def _on_event(self, event: object) -> None:
        if isinstance(event, Progress):
            self.progress.setVisible(True)
            self.progress.setMaximum(max(event.total, 1))
            self.progress.setValue(event.done)
            self.progress.setFormat(
                f"reading {event.done:,} / {event.total:,} tokens · "
                f"{event.stats.evicted_tokens:,} evicted"
            )
            self.graphs.add(event.stats)
        elif isinstance(event, Evicted):
            self.graphs.add(event.stats)
        elif isinstance(event, Recalled):
            n = len(event.excerpts)
            self.progress.setVisible(True)
            self.progress.setFormat(
                f"brought back {event.stats.recalled_tokens:,} evicted tokens from {n} "
                f"passage{'s' if n != 1 else ''} for this question"
            )
        elif isinstance(event, Token):
            self.progress.setVisible(False)
            self.graphs.last = event.stats
            self.answer += event.text
            self.chat.streaming = self.answer
            self.chat.render_soon()
        elif isinstance(event, Done):
            self.progress.setVisible(False)
            self.graphs.add(event.stats)
            s = event.stats
            ttft = f"{s.first_token_s:.1f} s" if s.first_token_s is not None else "n/a"
            meta = (
                f"{s.decode_tokens_per_s:.1f} tok/s · first token {ttft} · "
                f"{policy_label(s.policy)}, budget {s.budget_tokens:,} · "
                f"{s.cells_used:,} of {s.tokens_seen:,} tokens in cache"
            )
            if s.kv_type != "f16":
                meta += f" · KV {s.kv_type}"
            if s.recalled_tokens:
                meta += f" · brought back {s.recalled_tokens:,} evicted tokens"
            text = f"{self.job_prefix} {event.text.strip()}".strip()
            if self.replacing is not None:
                self.store.update_message(self.replacing, text, meta)
            elif self.job_conversation is not None:
                self.store.add_message(self.job_conversation, "assistant", text, meta)
            self.answer = ""
            self.replacing = None
            self._render()

    def _on_failed(self, message: str) -> None:
        self.progress.setVisible(False)
        self.error.setText(message)
        self.answer = ""
        self.replacing = None
        self._render()

    def _on_cancelled(self) -> None:
        self.progress.setVisible(False)
        answered = self.answer.strip() not in ("", self.job_prefix.strip())
        if answered and self.job_conversation is not None and self.replacing is None:
            self.store.add_message(
                self.job_conversation, "assistant", self.answer.strip(), "stopped"
            )
        self.answer = ""
        self.replacing = None
        self.error.setText("Stopped.")
        self._render()

    def _on_busy(self, busy: bool) -> None:
        self.busy = busy
        for b in (
            self.send_button,
            self.summarize_button,
            self.regenerate_button,
            self.panel.reload_button,
            self.panel.found_models,
            self.delete_button,
        ):
            b.setEnabled(not busy)
        if not busy:
            self.panel.refresh_reload_button()
        self.stop_button.setEnabled(busy)

    # -- view -------------------------------------------------------------

    def _update_status(self) -> None:
        label = policy_label(self.panel.policy_name())
        kv_type = self.panel.kv_type_name()
        kv = f" · KV {kv_type}" if kv_type != "f16" else ""
        cpu = f" · {self.cpu_note}" if self.cpu_note else ""
        self.statusBar().showMessage(
            f"{self.model_name} · {label} · budget {self.budget.value():,} tokens{kv}{cpu}"
        )

    def _show_documents(self) -> None:
        if not self.documents:
            self.doc_label.setText("No document attached: drop files here or use Attach…")
            self.clear_docs_button.setVisible(False)
            return
        chars = sum(len(text) for _, text in self.documents)
        names = ", ".join(name for name, _ in self.documents)
        self.doc_label.setText(
            f"<b>{names}</b> ({chars:,} characters): Summarize it, or ask about it below."
        )
        self.clear_docs_button.setVisible(True)

    def _refresh_conversations(self) -> None:
        conversations = self.store.conversations()
        current = self.conversation.id if self.conversation else None
        self.conversation = next((c for c in conversations if c.id == current), None)
        self.sidebar.show_conversations(conversations, current)

    def _select_conversation_id(self, cid: int | None) -> None:
        """Show a conversation and re-open its documents (a moved file is a message)."""
        self.conversation = next((c for c in self.store.conversations() if c.id == cid), None)
        self.documents = []
        self.error.clear()
        if self.conversation is not None:
            for doc in self.store.documents(self.conversation.id):
                if not self.attach(Path(doc.path), remember=False):
                    self.error.setText(f"{doc.name} could not be opened again: {self.error.text()}")
        self._show_documents()
        self._render()

    def _messages(self) -> list[Message]:
        return self.store.messages(self.conversation.id) if self.conversation else []

    def _render(self) -> None:
        visible = self.conversation is not None and self.conversation.id == self.job_conversation
        self.chat.streaming = self.answer if visible else ""
        self.chat.replacing = self.replacing
        self.chat.render()

    # -- drag and drop ----------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        for url in event.mimeData().urls():
            if url.isLocalFile():
                self.attach(Path(url.toLocalFile()))
        event.acceptProposedAction()

    def closeEvent(self, event: object) -> None:
        self.timer.stop()
        self.chat.stop()
        self.worker.stop()
        self.monitor.close()
        super().closeEvent(event)  # type: ignore[arg-type]
