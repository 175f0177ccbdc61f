"""The main window: conversations, chat over documents, policy settings, live graphs.

Widgets hold no inference logic: requests go to the engine worker as queued
signals, and its events come back through the worker thread's relay.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from engine import DocumentError, Done, Evicted, Progress, Token
from engine.documents import load_document
from engine.monitor import MemoryMonitor

from .graphs import MemoryGraphs
from .settings import Settings, save
from .store import Store
from .worker import Job, WorkerThread

POLICY_HELP = {
    "full": "Off: keeps every token; fails when the document does not fit the budget.",
    "streaming": "StreamingLLM: first tokens plus the most recent ones (llama.cpp's shift).",
    "h2o": "H2O: tokens with the most accumulated attention, plus a recent half.",
    "snapkv": "SnapKV: your question votes for what to keep at every eviction.",
    "tova": "TOVA: keeps what the newest token attends to.",
}


class _Input(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    def __init__(self, send: object) -> None:
        super().__init__()
        self._send = send
        self.setPlaceholderText("Ask about the document, or drop a file here…")
        self.setMaximumHeight(90)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self._send()  # type: ignore[operator]
            return
        super().keyPressEvent(event)


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
        self.document_text = ""
        self.document_name = ""
        self.answer = ""
        self.model_name = "loading model…"
        self.conversation = store.conversations()[0] if store.conversations() else None
        self.setWindowTitle("kvtrim")
        self.setAcceptDrops(True)
        self.resize(1200, 760)
        self._build()
        self._connect()
        self._refresh_conversations()
        self._render()
        self._sample_memory()
        worker.requests.load_model.emit(
            settings.model_path or None, settings.gpu_layers, settings.threads or None
        )

    # -- layout -----------------------------------------------------------

    def _build(self) -> None:
        self.conversations = QListWidget()
        new = QPushButton("New chat")
        new.clicked.connect(self.new_chat)
        self.rename_button = QPushButton("Rename")
        self.delete_button = QPushButton("Delete")
        self.export_button = QPushButton("Export…")
        self.rename_button.clicked.connect(self._rename_dialog)
        self.delete_button.clicked.connect(self.delete_chat)
        self.export_button.clicked.connect(self._export_dialog)
        row = QHBoxLayout()
        for b in (self.rename_button, self.delete_button, self.export_button):
            row.addWidget(b)
        left = QWidget()
        lv = QVBoxLayout(left)
        lv.addWidget(new)
        lv.addWidget(self.conversations)
        lv.addLayout(row)

        self.chat = QTextBrowser()
        self.chat.setOpenExternalLinks(True)
        self.doc_label = QLabel("No document attached.")
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.error = QLabel()
        self.error.setStyleSheet("color: #c0392b;")
        self.error.setWordWrap(True)
        self.input = _Input(self.send)
        self.attach_button = QPushButton("Attach…")
        self.summarize_button = QPushButton("Summarize")
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons = QHBoxLayout()
        for b in (self.attach_button, self.summarize_button, self.send_button, self.stop_button):
            buttons.addWidget(b)
        center = QWidget()
        cv = QVBoxLayout(center)
        cv.addWidget(self.doc_label)
        cv.addWidget(self.chat, 1)
        cv.addWidget(self.progress)
        cv.addWidget(self.error)
        cv.addWidget(self.input)
        cv.addLayout(buttons)

        self.policy = QComboBox()
        self.policy.addItems(list(POLICY_HELP))
        self.policy.setCurrentText(self.settings.policy)
        self.policy_help = QLabel(POLICY_HELP[self.settings.policy])
        self.policy_help.setWordWrap(True)
        self.budget = QSpinBox()
        self.budget.setRange(64, 131072)
        self.budget.setSingleStep(256)
        self.budget.setValue(self.settings.budget_tokens)
        self.budget.setSuffix(" tokens")
        self.graphs = MemoryGraphs()
        right = QWidget()
        form = QFormLayout(right)
        form.addRow("Eviction policy", self.policy)
        form.addRow(self.policy_help)
        form.addRow("KV budget", self.budget)
        form.addRow(self.graphs)
        self.memory = QLabel()
        self.memory.setWordWrap(True)
        form.addRow(self.memory)

        split = QSplitter()
        for w, stretch in ((left, 1), (center, 4), (right, 2)):
            split.addWidget(w)
            split.setStretchFactor(split.count() - 1, stretch)
        split.setSizes([220, 640, 420])
        self.setCentralWidget(split)

    def _connect(self) -> None:
        r = self.worker.results
        r.model_loaded.connect(self._on_model)
        r.event.connect(self._on_event)
        r.failed.connect(self._on_failed)
        r.cancelled.connect(self._on_cancelled)
        r.busy.connect(self._on_busy)
        self.send_button.clicked.connect(self.send)
        self.summarize_button.clicked.connect(self.summarize)
        self.stop_button.clicked.connect(self.stop)
        self.attach_button.clicked.connect(self._pick_file)
        self.policy.currentTextChanged.connect(self._policy_changed)
        self.budget.valueChanged.connect(self._update_status)
        self.budget.valueChanged.connect(self._save_settings)
        self.conversations.currentItemChanged.connect(self._select_conversation)
        QShortcut(QKeySequence("Ctrl+N"), self, self.new_chat)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.stop)

    # -- actions ----------------------------------------------------------

    def new_chat(self) -> None:
        self.conversation = self.store.new_conversation()
        self.document_text, self.document_name = "", ""
        self.doc_label.setText("No document attached.")
        self._refresh_conversations()
        self._render()

    def attach(self, path: Path) -> bool:
        """Read a document; a bad file shows its reason and changes nothing."""
        try:
            text = load_document(path)
        except DocumentError as exc:
            self.error.setText(str(exc))
            return False
        if self.conversation is None:
            self.new_chat()
        assert self.conversation is not None
        self.document_text, self.document_name = text, path.name
        self.store.add_document(self.conversation.id, path)
        self.doc_label.setText(f"Document: {path.name} ({len(text):,} characters)")
        self.error.clear()
        return True

    def send(self) -> None:
        question = self.input.toPlainText().strip()
        if not question or not self.send_button.isEnabled():
            return
        self.input.clear()
        self._start("ask", question)

    def summarize(self) -> None:
        if not self.document_text:
            self.error.setText("Attach a document first (drop a file or use Attach…).")
            return
        self._start("summarize", f"Summarize {self.document_name}")

    def stop(self) -> None:
        self.worker.worker.cancel()

    def rename_chat(self, title: str) -> None:
        if self.conversation is not None and title.strip():
            self.store.rename(self.conversation.id, title)
            self._refresh_conversations()

    def delete_chat(self) -> None:
        if self.conversation is None:
            return
        self.store.delete(self.conversation.id)
        rest = self.store.conversations()
        self.conversation = rest[0] if rest else None
        self._refresh_conversations()
        self._render()

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

    def _save_settings(self) -> None:
        self.settings.policy = self.policy.currentText()
        self.settings.budget_tokens = self.budget.value()
        if self.settings_path is not None:
            save(self.settings, self.settings_path)

    def _sample_memory(self) -> None:
        sample = self.monitor.sample()
        text = f"Process RAM {sample.rss_bytes / 2**20:.0f} MB"
        if sample.gpus:
            text += " · " + " · ".join(
                f"{g.name}: {g.used_bytes / 2**20:.0f} / {g.total_bytes / 2**20:.0f} MB"
                for g in sample.gpus
            )
        else:
            text += " · no NVIDIA GPU"
        self.memory.setText(text)

    def _start(self, kind: str, user_text: str) -> None:
        if self.conversation is None:
            self.new_chat()
        assert self.conversation is not None
        self.store.add_message(self.conversation.id, "user", user_text)
        if self.conversation.title == "New chat":
            self.store.rename(self.conversation.id, user_text[:40])
            self._refresh_conversations()
        self.answer = ""
        self.error.clear()
        self.graphs.clear()
        self._render()
        self.worker.requests.run.emit(
            Job(
                kind,
                self.document_text,
                user_text,
                self.policy.currentText(),
                self.budget.value(),
                self.settings.max_tokens,
            )
        )

    def _pick_file(self) -> None:
        name, _ = QFileDialog.getOpenFileName(
            self, "Attach a document", "", "Documents (*.txt *.md *.html *.htm *.pdf *.docx)"
        )
        if name:
            self.attach(Path(name))

    # -- worker results ---------------------------------------------------

    def _on_model(self, name: str) -> None:
        self.model_name = name
        self._update_status()

    def _on_event(self, event: object) -> None:
        self._sample_memory()
        if isinstance(event, Progress):
            self.progress.setVisible(True)
            self.progress.setMaximum(max(event.total, 1))
            self.progress.setValue(event.done)
            self.progress.setFormat(f"reading %v / %m tokens, {event.stats.evicted_tokens} evicted")
            self.graphs.add(event.stats)
        elif isinstance(event, Evicted):
            self.graphs.add(event.stats)
        elif isinstance(event, Token):
            self.progress.setVisible(False)
            self.answer += event.text
            self._render()
        elif isinstance(event, Done):
            self.graphs.add(event.stats)
            s = event.stats
            ttft = f"{s.first_token_s:.1f}s" if s.first_token_s is not None else "n/a"
            footer = (
                f"\n\n*{s.decode_tokens_per_s:.1f} tok/s, first token {ttft}, "
                f"{s.policy} budget {s.budget_tokens}*"
            )
            assert self.conversation is not None
            self.store.add_message(self.conversation.id, "assistant", event.text.strip() + footer)
            self.answer = ""
            self._render()

    def _on_failed(self, message: str) -> None:
        self.progress.setVisible(False)
        self.error.setText(message)

    def _on_cancelled(self) -> None:
        self.progress.setVisible(False)
        if self.answer and self.conversation is not None:
            self.store.add_message(self.conversation.id, "assistant", self.answer + " *(stopped)*")
        self.answer = ""
        self.error.setText("Stopped.")
        self._render()

    def _on_busy(self, busy: bool) -> None:
        for b in (self.send_button, self.summarize_button, self.attach_button):
            b.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    # -- view -------------------------------------------------------------

    def _policy_changed(self, name: str) -> None:
        self.policy_help.setText(POLICY_HELP[name])
        self._update_status()
        self._save_settings()

    def _update_status(self) -> None:
        self.statusBar().showMessage(
            f"{self.model_name} · {self.policy.currentText()} · budget {self.budget.value()} tokens"
        )

    def _refresh_conversations(self) -> None:
        self.conversations.blockSignals(True)
        self.conversations.clear()
        for c in self.store.conversations():
            item = QListWidgetItem(c.title)
            item.setData(Qt.ItemDataRole.UserRole, c.id)
            self.conversations.addItem(item)
            if self.conversation and c.id == self.conversation.id:
                self.conversations.setCurrentItem(item)
        self.conversations.blockSignals(False)

    def _select_conversation(self, item: QListWidgetItem | None) -> None:
        if item is None:
            return
        cid = item.data(Qt.ItemDataRole.UserRole)
        self.conversation = next(c for c in self.store.conversations() if c.id == cid)
        docs = self.store.documents(cid)
        self.document_text, self.document_name = "", ""
        if docs:
            self.attach(Path(docs[-1].path))
        else:
            self.doc_label.setText("No document attached.")
        self._render()

    def _render(self) -> None:
        parts = []
        if self.conversation is not None:
            for m in self.store.messages(self.conversation.id):
                who = "**You**" if m.role == "user" else "**kvtrim**"
                parts.append(f"{who}\n\n{m.content}")
        if self.answer:
            parts.append(f"**kvtrim**\n\n{self.answer}▍")
        self.chat.setMarkdown("\n\n---\n\n".join(parts) or "*Drop a document to begin.*")
        bar = self.chat.verticalScrollBar()
        bar.setValue(bar.maximum())

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
        self.worker.stop()
        self.monitor.close()
        super().closeEvent(event)  # type: ignore[arg-type]
