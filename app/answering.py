"""A request from the window to the engine worker, and its answer coming back.

``Answering`` builds the worker's ``Job`` from the settings, shows the answer's
stage at once ("reading 512 / 8,876 tokens", "bringing back 256 tokens",
"writing…") until its first token, streams it, and stores it with its figures
and why it stopped in the conversation it was asked in, whichever one is shown.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from PySide6.QtGui import QGuiApplication

from engine import Done, Evicted, Progress, Recalled, Token
from engine.policies import label as policy_label
from engine.runtime.spec import RequestSpec
from engine.session.sampling import Sampling
from engine.stats import KVStats

from .chat import ChatView, MessageInput, Pending
from .chat_pane import ChatPane, ReadingBar
from .graphs import MemoryGraphs
from .settings import Settings
from .settings_panel import SettingsPanel
from .store import Conversation, Store
from .worker import Job, WorkerThread


class Window(Protocol):
    """What ``Answering`` uses of the main window."""

    store: Store
    settings: Settings
    panel: SettingsPanel
    worker: WorkerThread
    pane: ChatPane
    chat: ChatView
    input: MessageInput
    progress: ReadingBar
    graphs: MemoryGraphs
    conversation: Conversation | None
    documents: list[Any]
    busy: bool

    status: Any  # status.Status

    @property
    def error(self) -> Any: ...  # a QLabel

    def statusBar(self) -> Any: ...
    def ensure_conversation(self, first_message: str) -> int: ...
    def document_text(self) -> str: ...
    def render(self) -> None: ...


REGENERATE_TEMPERATURE = 0.7
STOPPED = "stopped"  # the meta line of an answer the user stopped
REASONS = {  # Done.reason in words, at the end of each answer's meta line
    "eog": "end of answer",
    "length": "max tokens reached",
    "stop": "stop string",
    "repetition": "stopped a repeating loop",
    "cancelled": STOPPED,
}


def stop_reason(reason: str) -> str:
    """Why an answer ended, in words."""
    return REASONS.get(reason, reason)


def stage(event: object) -> str | None:
    """What the answer waits for, after ``event``; None for events that say nothing."""
    if isinstance(event, Progress):
        if event.done >= event.total:
            return "writing…"
        return f"reading {event.done:,} / {event.total:,} tokens"
    if isinstance(event, Recalled):
        return f"bringing back {event.tokens:,} tokens"
    return None


def meta_line(stats: KVStats, reason: str) -> str:
    """The figures under an answer, ending with why it stopped."""
    ttft = f"{stats.first_token_s:.1f} s" if stats.first_token_s is not None else "n/a"
    meta = (
        f"{stats.decode_tokens_per_s:.1f} tok/s · first token {ttft} · "
        f"{policy_label(stats.policy)}, budget {stats.budget_tokens:,} · "
        f"{stats.cells_used:,} of {stats.tokens_seen:,} tokens in cache"
    )
    if stats.kv_type != "f16":
        meta += f" · KV {stats.kv_type}"
    if stats.recalled_tokens:
        meta += f" · brought back {stats.recalled_tokens:,} evicted tokens"
    if stats.reads > 1:  # a summary part by part: its figures are the document's
        meta += f" · read in {stats.reads} passes"
    return f"{meta} · {stop_reason(reason)}"


def history(messages: list, before: int | None = None) -> tuple[tuple[str, str], ...]:
    """(question, answer) pairs of ``messages``, up to message id ``before``."""
    pairs, question = [], None
    for m in messages:
        if before is not None and m.id >= before:
            break
        if m.role == "user":
            question = m.content
        elif m.role == "assistant" and question is not None:
            pairs.append((question, m.content))
            question = None
    return tuple(pairs)


class Answering:
    """The running request, on the GUI thread; ``window`` shows it."""

    def __init__(self, window: Window) -> None:
        self.w = window
        self.conversation: int | None = None  # where the running answer goes
        self.replacing: int | None = None  # the answer a regeneration replaces when done
        self.prefix = ""  # the answer prefix of the running job
        self.pending: Pending | None = None  # the answer being written

    @property
    def running(self) -> bool:
        """A request is on its way or running (busy comes from the worker, later)."""
        return self.w.busy or self.pending is not None

    @property
    def visible(self) -> bool:
        """Whether the conversation shown is the one being answered."""
        current = self.w.conversation
        return current is not None and current.id == self.conversation

    # -- what the user asks for -------------------------------------------

    def send(self) -> None:
        """The message box's question (Enter or Send)."""
        question = self.w.input.toPlainText().strip()
        if not question or self.running:
            return
        self.w.input.clear()
        self.start("ask", question)

    def summarize(self) -> None:
        if not self.w.documents:
            self.w.error.setText("Attach a document first (drop a file or use Attach…).")
            return
        if not self.running:
            names = ", ".join(d.name for d in self.w.documents)
            self.start("summarize", f"Summarize {names}")

    def regenerate(self) -> None:
        """Answer the last question again, sampling this time; the new answer replaces
        the old one when it is complete (a Stop or an error keeps the old one)."""
        w = self.w
        if self.running or w.conversation is None:
            return
        messages = w.store.messages(w.conversation.id)
        if len(messages) < 2 or messages[-1].role != "assistant":
            return
        question = messages[-2].content
        kind = "summarize" if question.startswith("Summarize ") and w.documents else "ask"
        self.start(kind, question, replace=messages[-1].id)

    def copy_answer(self) -> None:
        """The last answer to the clipboard, confirmed on the button and the status bar."""
        w = self.w
        messages = w.store.messages(w.conversation.id) if w.conversation else []
        answers = [m for m in messages if m.role == "assistant"]
        if not answers:
            w.statusBar().showMessage("No answer to copy yet.", 3000)
            return
        QGuiApplication.clipboard().setText(answers[-1].content)
        w.pane.confirm_copied()
        w.statusBar().showMessage("Answer copied to the clipboard.", 3000)

    def stop(self) -> None:
        self.w.worker.worker.cancel()

    def start(self, kind: str, user_text: str, *, replace: int | None = None) -> None:
        """Store the question (a new chat is saved now), show the stage, send the job."""
        w = self.w
        cid = w.ensure_conversation(user_text)
        messages = w.store.messages(cid)
        if replace is None:
            past = history(messages)
            w.store.add_message(cid, "user", user_text)
        else:
            asked = [m.id for m in messages if m.role == "user" and m.id < replace]
            past = history(messages, before=asked[-1])
        self.conversation, self.replacing = cid, replace
        self.prefix = w.settings.answer_prefix if kind == "ask" else ""
        self.pending = Pending(f"{self.prefix} " if self.prefix else "", "reading…", replace)
        w.error.clear()
        w.graphs.start()
        w.render()  # the stage shows now, before the worker has the job
        w.worker.worker.arm()
        w.worker.requests.run.emit(
            Job(
                kind,
                w.document_text(),
                user_text,
                self._spec(fresh=replace is not None),
                conversation=cid,
                history=past,
                system=w.settings.system_prompt,
                fresh=replace is not None,
            )
        )

    def session_key(self) -> tuple[Any, ...]:
        """The session settings the next message would run with."""
        return self._spec(fresh=False).session_key()

    def _spec(self, *, fresh: bool) -> RequestSpec:
        """The request's options: the settings, sampling afresh for a regeneration."""
        s, panel = self.w.settings, self.w.panel
        temperature = max(s.temperature, REGENERATE_TEMPERATURE) if fresh else s.temperature
        return RequestSpec(
            policy=panel.policy_name(),
            budget_tokens=s.budget_tokens,
            kv_type=panel.kv_type_name(),
            policy_settings=panel.policy_settings(),
            max_tokens=s.max_tokens,
            sampling=Sampling(
                temperature=temperature, seed=random.randrange(2**31) if fresh else None
            ),
            answer_prefix=self.prefix,
        )

    # -- the worker's results ---------------------------------------------

    def on_event(self, event: object) -> None:
        """The answer's stage or text, stored when done (in whichever chat asked);
        its progress and graphs only while its chat is shown."""
        self._follow(event)
        if not self.visible:
            return
        w = self.w
        if isinstance(event, Progress | Evicted | Done):
            w.graphs.add(event.stats)
        if isinstance(event, Progress):
            w.progress.show_reading(event.done, event.total, event.stats.evicted_tokens)
        elif isinstance(event, Recalled):
            w.progress.show_recall(event.stats.recalled_tokens, len(event.excerpts))
        elif isinstance(event, Token):
            w.progress.setVisible(False)
            w.graphs.last = event.stats

    def _follow(self, event: object) -> None:
        pending = self.pending
        if pending is None:
            return
        if isinstance(event, Token):
            pending.text += event.text
            pending.writing = True
            self.w.chat.render_soon()
        elif isinstance(event, Done):
            text = f"{self.prefix} {event.text.strip()}".strip()
            meta = meta_line(event.stats, event.reason)
            if self.conversation is not None:
                self.w.status.caches.answered(self.conversation, self.session_key(), event.stats)
            if self.replacing is not None:
                self.w.store.update_message(self.replacing, text, meta)
            elif self.conversation is not None:
                self.w.store.add_message(self.conversation, "assistant", text, meta)
            self._finish()
        elif (text := stage(event)) is not None and not pending.writing:
            pending.stage = text
            self.w.chat.render_soon()

    def on_failed(self, message: str) -> None:
        """A job's failure shows in its own chat; elsewhere (a model load) always."""
        if self.pending is None or self.visible:
            self.w.error.setText(message)
        else:
            self.w.statusBar().showMessage(f"The answer in another chat failed: {message}", 15_000)
        if self.pending is not None:
            self._finish()

    def on_cancelled(self) -> None:
        """What was written so far is kept (a partial answer, marked stopped)."""
        pending = self.pending
        written = pending.text.strip() if pending is not None else ""
        cid = self.conversation
        if written not in ("", self.prefix.strip()) and self.replacing is None and cid is not None:
            self.w.store.add_message(cid, "assistant", written, STOPPED)
        if self.visible:
            self.w.error.setText("Stopped.")
        self._finish()

    def _finish(self) -> None:
        self.pending = None
        self.replacing = None
        self.w.progress.setVisible(False)
        self.w.render()
