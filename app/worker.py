"""The engine off the GUI thread: a worker object living in a QThread.

The GUI calls the worker's slots through queued signals; the worker runs the
engine's generators and turns every engine event into a queued Qt signal. Only
``cancel()`` is called directly from the GUI thread: it only sets a flag that
llama.cpp's abort callback and the token loop read.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine import Cancelled, Done, Engine, KvtrimError, Restored, Session, StateError, Token
from engine.runtime.chat import turn_events
from engine.runtime.spec import RequestSpec
from engine.runtime.states import StateStore
from engine.session.state import SavedState
from engine.session.trace import display_roles
from engine.stats import Event

from .resume import POST, PRE, ChatStates, restore

MAP_EVERY_S = 0.5  # memory maps while a job runs: twice a second, and at the end

EngineFactory = Callable[[str | None, int, int | None], Any]
"""``(model_path, gpu_layers, threads) -> Engine``: swapped for a fake in tests."""


@dataclass(frozen=True)
class Job:
    """One request: read ``document`` (may be empty), then answer or summarize.

    ``history`` holds the conversation's earlier (question, answer) turns. When
    the worker still has this conversation's session, with the same settings and
    exactly those turns in it, a question continues that cache (``follow_up``);
    otherwise the document and the transcript are read again, with eviction.
    """

    kind: str  # "ask" or "summarize"
    document: str
    question: str
    spec: RequestSpec  # policy, budget, KV type, sampling, answer prefix...
    conversation: int = 0
    history: tuple[tuple[str, str], ...] = ()
    system: str = ""
    fresh: bool = False  # read everything again (Regenerate)

    def key(self) -> tuple[Any, ...]:
        """What a live session must match to be continued."""
        return (self.conversation, self.spec.session_key(), self.system, self.document)

    def transcript(self) -> str:
        """The document followed by the earlier turns, as plain text."""
        turns = "".join(f"\n\nQuestion: {q}\nAnswer: {a}" for q, a in self.history)
        return self.document + turns


@dataclass
class _Chat:
    """The session a conversation continues, and how many turns it holds."""

    key: tuple[Any, ...]
    session: Session
    turns: int


class EngineWorker(QObject):
    """Owns the engine; all of its methods run in the worker thread."""

    model_loaded = Signal(str)  # model name
    cpu_path = Signal(str)  # llama.cpp's CPU path and repacking, for the status line
    notice = Signal(str)  # something the user should know that is not an error
    event = Signal(object)  # an engine Event (Progress, Evicted, Token, Done)
    memory_map = Signal(object)  # an engine.trace.MemoryMap, at most MAP_EVERY_S apart
    failed = Signal(str)  # a one-line message for the user
    cancelled = Signal()
    busy = Signal(bool)
    saved = Signal(int, int)  # a chat's id, the bytes of its saved caches on disk

    def __init__(
        self, factory: EngineFactory | None = None, states: StateStore | None = None
    ) -> None:
        """``states``: where chats' caches are saved (None: not saved, every restart
        reads the document again)."""
        super().__init__()
        self._states = ChatStates(states) if states is not None else None
        self._pre: SavedState | None = None  # the running answer's start (for Regenerate)
        self._pre_stops: tuple[str, ...] = ()  # the stop strings of a restarted answer
        self._stop = threading.Event()  # Stop pressed since the running job was sent
        self._factory: EngineFactory = factory or (
            lambda path, layers, threads: Engine(path, n_gpu_layers=layers, n_threads=threads)
        )
        self._engine: Any = None
        self._session: Session | None = None
        self._chat: _Chat | None = None
        self._model_args: tuple[str | None, int, int | None] | None = None

    @Slot(object, int, object)
    def load_model(self, path: str | None, gpu_layers: int, threads: int | None) -> None:
        """(Re)load a model; the old one is closed first so its memory is freed.

        If the new one fails, the previous model is loaded again, so a bad file
        costs a message, not a working app.
        """
        self.busy.emit(True)
        previous = self._model_args
        try:
            self._drop_chat()
            if self._engine is not None:
                self._engine.close()
                self._engine = None
            self._engine = self._factory(path, gpu_layers, threads)
            self._model_args = (path, gpu_layers, threads)
            self.model_loaded.emit(self._engine.model_name)
            cpu = getattr(getattr(self._engine, "model", None), "cpu_path", None)
            if cpu is not None:
                self.cpu_path.emit(cpu.short())
            for note in getattr(self._engine, "notes", ()):
                self.notice.emit(note)
        except Exception as exc:  # the GUI must survive anything the engine raises
            message = str(exc) if isinstance(exc, KvtrimError) else f"could not load: {exc}"
            if not isinstance(exc, KvtrimError):
                traceback.print_exc()
            if previous is not None and previous[:1] != (path,):
                try:
                    self._engine = self._factory(*previous)
                    self.model_loaded.emit(self._engine.model_name)
                    message += f"; kept {self._engine.model_name}"
                except Exception:
                    self._engine = None
            self.failed.emit(message)
        finally:
            self.busy.emit(False)

    @Slot(object)
    def run(self, job: Job) -> None:
        """Run a job to the end (or to a cancel), emitting its events."""
        if self._engine is None:
            self.failed.emit("no model is loaded")
            return
        self.busy.emit(True)
        ok = answered = False
        done_text = ""
        try:
            session, events = self._start(job)
            self._session = session
            if self._stop.is_set():  # Stop came before the session was open
                session.cancel()
            last_map = 0.0
            for item in events:
                self.event.emit(item)
                if isinstance(item, Done):
                    done_text = item.text
                ok = ok or isinstance(item, Done)
                answered = answered or isinstance(item, Token)
                now = time.monotonic()
                if ok or now - last_map >= MAP_EVERY_S:
                    last_map = now
                    self._send_map(session)
        except Cancelled:
            self.cancelled.emit()
        except KvtrimError as exc:
            self.failed.emit(str(exc))
        except MemoryError:
            self.failed.emit("out of memory; try a smaller budget or fewer GPU layers")
        except Exception as exc:
            self.failed.emit(f"unexpected error: {exc}")
            traceback.print_exc()
        finally:
            if ok and self._session is not None:
                self._chat = _Chat(job.key(), self._session, len(job.history) + 1)
                self._save(job, self._session, done_text)
            elif self._chat is None or self._chat.session is not self._session:
                # a fresh session that did not finish is closed at once
                if self._session is not None:
                    self._session.close()
            elif answered or not getattr(self._chat.session, "can_follow_up", False):
                self._drop_chat()  # a cancelled follow-up leaves a half-written answer
            # else: stopped before its answer began, the session rolled the turn back
            self._session = None
            self._stop.clear()  # a Stop belongs to the job it came for
            self.busy.emit(False)

    def _start(self, job: Job) -> tuple[Session, Iterator[Event]]:
        """The chat's session when this job continues it (same settings, same turns),
        else its saved cache (``resume.py``), else a fresh read; ``turn_events``
        decides follow-up or first read."""
        spec = job.spec
        chat = self._chat
        continues = (
            job.kind == "ask"
            and not job.fresh
            and chat is not None
            and chat.key == job.key()
            and chat.turns == len(job.history)
        )
        restored: list[Event] = []
        if continues:
            assert chat is not None
            session = chat.session
        else:
            self._drop_chat()
            session = spec.open(self._engine)
            resumed = self._resume(job, session)
            if resumed is not None:
                restored.append(resumed)
                if job.fresh:  # Regenerate: the answer starts again where it began
                    stops = tuple(self._pre_stops)
                    gen = session.generate(
                        max_tokens=spec.max_tokens, sampling=spec.sampling, stops=stops
                    )
                    return self._watched(session), chain(restored, gen)
        _, events = turn_events(
            session,
            job.transcript() if job.kind == "ask" else job.document,
            job.question if job.kind == "ask" else None,
            answer_prefix=spec.answer_prefix,
            system=job.system,
            max_tokens=spec.max_tokens,
            sampling=spec.sampling,
        )
        return self._watched(session), chain(restored, events)

    def _resume(self, job: Job, session: Session) -> Event | None:
        """The chat's saved cache in ``session``: the state before the replaced answer
        for a Regenerate, after the last answer for a question; None when there is
        none to try or it cannot be used (the reason is a notice; a re-read follows)."""
        if self._states is None or not hasattr(session, "restore"):
            return None
        if job.kind != "ask" and not job.fresh:
            return None  # Summarize reads the document as it is attached now
        kind = PRE if job.fresh else POST
        states, loaded = self._states, []

        def load() -> SavedState:
            loaded.append(states.load(job, kind, job.history))
            return loaded[-1]

        event = restore(session, load, lambda: states.delete(job.conversation, (kind,)))
        if isinstance(event, Restored) and event.reason:
            if "no saved cache" not in event.reason:
                self.notice.emit(f"Reading the document again: {_reason(event.reason)}.")
            return None
        self._pre_stops = tuple(loaded[0].extra.get("stops", ())) if job.fresh else ()
        return event

    def _watched(self, session: Session) -> Session:
        """``session`` with the worker's hook at the start of each answer: the cache
        is kept in RAM there (the ``pre`` state a Regenerate restarts from)."""
        reader = getattr(session, "reader", None)
        if reader is not None and self._states is not None:
            self._pre = None

            def checkpoint(name: str) -> None:
                if name == "answer":
                    stops = list(getattr(reader, "answer_stops", ()))
                    self._pre = session.snapshot({"stops": stops})

            reader.checkpoint = checkpoint
        return session

    def _save(self, job: Job, session: Session, answer: str) -> None:
        """After an answer: the live cache is saved and takes the saved layout (a chat
        resumed later answers exactly as this one would), and the answer's start."""
        states, pre = self._states, self._pre
        self._pre = None
        if states is None or not hasattr(session, "snapshot"):
            return
        turns = (*job.history, (job.question, job.spec.answer(answer)))
        try:
            post = session.snapshot()
            session.restore(post)
            size = states.save(job, POST, post, turns)
            if pre is not None:
                size += states.save(job, PRE, pre, job.history)
        except StateError as exc:  # saving is a convenience: the chat goes on
            self.notice.emit(f"This chat's cache was not saved: {exc}")
            if not getattr(session, "can_follow_up", False):
                self._drop_chat()
            return
        self.saved.emit(job.conversation, size)

    def _send_map(self, session: Any) -> None:
        """What the cache holds, computed here where the session lives."""
        memory_map = getattr(session, "memory_map", None)
        if memory_map is not None:
            m = memory_map()
            display_roles(m)  # its text and roles, here rather than in the window's thread
            self.memory_map.emit(m)

    def _drop_chat(self) -> None:
        if self._chat is not None:
            self._chat.session.close()
            self._chat = None

    @Slot()
    def forget(self) -> None:
        """Free the live chat session (the conversation changed or was deleted)."""
        self._drop_chat()

    def arm(self) -> None:
        """Thread-safe, called as a job is sent: a Stop from now on stops that job,
        even one pressed before the worker has opened its session."""
        self._stop.clear()

    def cancel(self) -> None:
        """Thread-safe: stop the running job soon (or the one sent, as it starts)."""
        self._stop.set()
        session = self._session
        if session is not None:
            session.cancel()

    @Slot(int)
    def delete_chat(self, conversation: int) -> None:
        """The chat was deleted: its saved caches go with it (here, after any write)."""
        if self._chat is not None and self._chat.key[0] == conversation:
            self._drop_chat()
        if self._states is not None:
            self._states.delete(conversation)

    @Slot(int)
    def report_saved(self, conversation: int) -> None:
        """Say how much disk a chat's saved caches take (``saved``)."""
        if self._states is not None:
            self.saved.emit(conversation, self._states.disk_bytes(conversation))

    @Slot()
    def shutdown(self) -> None:
        self._drop_chat()
        if self._engine is not None:
            self._engine.close()
            self._engine = None


class _Requests(QObject):
    """GUI-side signals; connected to the worker's slots, so they arrive queued."""

    load_model = Signal(object, int, object)
    run = Signal(object)
    forget = Signal()
    delete_chat = Signal(int)
    report_saved = Signal(int)
    shutdown = Signal()


class _Relay(QObject):
    """Lives on the GUI thread and re-emits the worker's signals there, so any
    receiver (a widget method or a plain function) runs on the GUI thread."""

    model_loaded = Signal(str)
    cpu_path = Signal(str)
    notice = Signal(str)
    event = Signal(object)
    memory_map = Signal(object)
    failed = Signal(str)
    cancelled = Signal()
    busy = Signal(bool)
    saved = Signal(int, int)


class WorkerThread:
    """Starts an ``EngineWorker`` in its own QThread; ``requests`` reach it queued
    and its results come back queued through ``results``."""

    def __init__(
        self, factory: EngineFactory | None = None, states: StateStore | None = None
    ) -> None:
        self.thread = QThread()
        self.thread.setObjectName("kvtrim-engine")
        self.worker = EngineWorker(factory, states)
        self.worker.moveToThread(self.thread)
        self.requests = _Requests()
        self.requests.load_model.connect(self.worker.load_model)
        self.requests.run.connect(self.worker.run)
        self.requests.forget.connect(self.worker.forget)
        self.requests.delete_chat.connect(self.worker.delete_chat)
        self.requests.report_saved.connect(self.worker.report_saved)
        self.requests.shutdown.connect(self.worker.shutdown)
        self.results = _Relay()
        names = (
            "model_loaded",
            "cpu_path",
            "notice",
            "event",
            "memory_map",
            "failed",
            "cancelled",
            "busy",
            "saved",
        )
        for name in names:
            getattr(self.worker, name).connect(getattr(self.results, name))
        self.thread.start()

    def stop(self) -> None:
        self.worker.cancel()
        self.requests.shutdown.emit()
        self.thread.quit()
        self.thread.wait(10_000)


def _reason(why: str) -> str:
    """Why a saved cache was not used, as the second half of a notice: "its saved cache
    was saved with ...", or "the saved cache is damaged: ..." as it is."""
    return why if why.startswith("the saved cache") else f"its saved cache {why}"
