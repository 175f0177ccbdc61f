"""The engine off the GUI thread: a worker object living in a QThread.

The GUI calls the worker's slots through queued signals; the worker runs the
engine's generators and turns every engine event into a queued Qt signal. Only
``cancel()`` is called directly from the GUI thread: it only sets a flag that
llama.cpp's abort callback and the token loop read.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine import Cancelled, Engine, KvtrimError, Session
from engine.stats import Event

EngineFactory = Callable[[str | None, int, int | None], Any]
"""``(model_path, gpu_layers, threads) -> Engine``: swapped for a fake in tests."""


@dataclass(frozen=True)
class Job:
    """One request: read ``document`` (may be empty), then answer or summarize."""

    kind: str  # "ask" or "summarize"
    document: str
    question: str
    policy: str
    budget_tokens: int
    max_tokens: int
    policy_settings: tuple[tuple[str, Any], ...] = ()


class EngineWorker(QObject):
    """Owns the engine; all of its methods run in the worker thread."""

    model_loaded = Signal(str)  # model name
    event = Signal(object)  # an engine Event (Progress, Evicted, Token, Done)
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

    @Slot(object, int, object)
    def load_model(self, path: str | None, gpu_layers: int, threads: int | None) -> None:
        """(Re)load a model; the old one is closed first so its memory is freed."""
        self.busy.emit(True)
        try:
            if self._engine is not None:
                self._engine.close()
                self._engine = None
            self._engine = self._factory(path, gpu_layers, threads)
            self.model_loaded.emit(self._engine.model_name)
        except KvtrimError as exc:
            self.failed.emit(str(exc))
        except Exception as exc:  # the GUI must survive anything the engine raises
            self.failed.emit(f"could not load the model: {exc}")
            traceback.print_exc()
        finally:
            self.busy.emit(False)

    @Slot(object)
    def run(self, job: Job) -> None:
        """Run a job to the end (or to a cancel), emitting its events."""
        if self._engine is None:
            self.failed.emit("no model is loaded")
            return
        self.busy.emit(True)
        try:
            session = self._engine.session(
                job.policy, job.budget_tokens, **dict(job.policy_settings)
            )
            self._session = session
            with session:
                for item in self._events(session, job):
                    self.event.emit(item)
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
            self._session = None
            self.busy.emit(False)

    @staticmethod
    def _events(session: Session, job: Job) -> Iterator[Event]:
        if job.kind == "summarize":
            return session.summarize(job.document, max_tokens=job.max_tokens)
        return session.ask(job.document, job.question, max_tokens=job.max_tokens)

    def cancel(self) -> None:
        """Thread-safe: stop the running job soon."""
        session = self._session
        if session is not None:
            session.cancel()

    @Slot()
    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


class _Requests(QObject):
    """GUI-side signals; connected to the worker's slots, so they arrive queued."""

    load_model = Signal(object, int, object)
    run = Signal(object)
    shutdown = Signal()


class _Relay(QObject):
    """Lives on the GUI thread and re-emits the worker's signals there, so any
    receiver (a widget method or a plain function) runs on the GUI thread."""

    model_loaded = Signal(str)
    event = Signal(object)
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
        self.requests.shutdown.connect(self.worker.shutdown)
        self.results = _Relay()
        for name in ("model_loaded", "event", "failed", "cancelled", "busy"):
            getattr(self.worker, name).connect(getattr(self.results, name))
        self.thread.start()

    def stop(self) -> None:
        self.worker.cancel()
        self.requests.shutdown.emit()
        self.thread.quit()
        self.thread.wait(10_000)
