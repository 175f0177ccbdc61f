"""The engine off the GUI thread: a worker object living in a QThread.

The GUI calls the worker's slots through queued signals; the worker runs the
engine's generators and turns every engine event into a queued Qt signal. Only
``cancel()`` is called directly from the GUI thread: it only sets a flag that
llama.cpp's abort callback and the token loop read.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine import Cancelled, Done, Engine, KvtrimError, Session, Token
from engine.runtime.chat import turn_events
from engine.runtime.spec import RequestSpec
from engine.stats import Event

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

    def __init__(self, factory: EngineFactory | None = None) -> None:
        super().__init__()
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
        try:
            session, events = self._start(job)
            self._session = session
            last_map = 0.0
            for item in events:
                self.event.emit(item)
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
            elif self._chat is None or self._chat.session is not self._session:
                # a fresh session that did not finish is closed at once
                if self._session is not None:
                    self._session.close()
            elif answered or not getattr(self._chat.session, "can_follow_up", False):
                self._drop_chat()  # a cancelled follow-up leaves a half-written answer
            # else: stopped before its answer began, the session rolled the turn back
            self._session = None
            self.busy.emit(False)

    def _start(self, job: Job) -> tuple[Session, Iterator[Event]]:
        """The chat's session when this job continues it (same settings, same turns),
        else a fresh one; ``turn_events`` decides follow-up or first read."""
        spec = job.spec
        chat = self._chat
        continues = (
            job.kind == "ask"
            and not job.fresh
            and chat is not None
            and chat.key == job.key()
            and chat.turns == len(job.history)
        )
        if continues:
            assert chat is not None
            session = chat.session
        else:
            self._drop_chat()
            session = spec.open(self._engine)
        _, events = turn_events(
            session,
            job.transcript() if job.kind == "ask" else job.document,
            job.question if job.kind == "ask" else None,
            answer_prefix=spec.answer_prefix,
            system=job.system,
            max_tokens=spec.max_tokens,
            sampling=spec.sampling,
        )
        return session, events

    def _send_map(self, session: Any) -> None:
        """What the cache holds, computed here where the session lives."""
        memory_map = getattr(session, "memory_map", None)
        if memory_map is not None:
            self.memory_map.emit(memory_map())

    def _drop_chat(self) -> None:
        if self._chat is not None:
            self._chat.session.close()
            self._chat = None

    @Slot()
    def forget(self) -> None:
        """Free the live chat session (the conversation changed or was deleted)."""
        self._drop_chat()

    def cancel(self) -> None:
        """Thread-safe: stop the running job soon."""
        session = self._session
        if session is not None:
            session.cancel()

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


class WorkerThread:
    """Starts an ``EngineWorker`` in its own QThread; ``requests`` reach it queued
    and its results come back queued through ``results``."""

    def __init__(self, factory: EngineFactory | None = None) -> None:
        self.thread = QThread()
        self.thread.setObjectName("kvtrim-engine")
        self.worker = EngineWorker(factory)
        self.worker.moveToThread(self.thread)
        self.requests = _Requests()
        self.requests.load_model.connect(self.worker.load_model)
        self.requests.run.connect(self.worker.run)
        self.requests.forget.connect(self.worker.forget)
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
        )
        for name in names:
            getattr(self.worker, name).connect(getattr(self.results, name))
        self.thread.start()

    def stop(self) -> None:
        self.worker.cancel()
        self.requests.shutdown.emit()
        self.thread.quit()
        self.thread.wait(10_000)
