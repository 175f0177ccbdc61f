"""The engine worker in its QThread: events arrive as queued signals, errors as
messages, cancel works; a fake engine for most, the real model for one."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from app.worker import Job, WorkerThread
from engine import Cancelled, Done, KVStats, ModelError, Progress, Token
from engine.runtime.spec import RequestSpec


def _stats() -> KVStats:
    return KVStats(policy="fake", budget_tokens=64, n_ctx=128, kv_bytes_per_cell=1)


class FakeSession:
    """Records what it was asked; answers "forty-two" after ``steps`` progress events."""

    def __init__(self, steps: int, delay: float) -> None:
        self.steps, self.delay = steps, delay
        self.stop = threading.Event()
        self.calls: list[tuple[str, str]] = []  # (method, text read)
        self.gen: list[dict] = []  # the options of each call
        self.prompts: list = []  # the prompts of each run
        self.closed = False
        self.read = False  # a first read finished: follow-ups continue it

    @property
    def can_follow_up(self) -> bool:
        return self.read

    def cancel(self) -> None:
        self.stop.set()

    def close(self) -> None:
        self.closed = True

    def _answer(self):
        for i in range(self.steps):
            if self.stop.is_set():
                raise Cancelled("cancelled")
            time.sleep(self.delay)
            yield Progress(i + 1, self.steps, _stats())
        yield Token(1, "forty-two", _stats())
        self.read = True
        yield Done("forty-two", "stop", _stats())

    def ask(self, document, question, **gen):
        self.stop.clear()  # as Session.run: a cancel is cleared as the run starts
        self.calls.append(("ask", document + "|" + question))
        self.gen.append(gen)
        return self._answer()

    def summarize(self, document, **gen):
        self.stop.clear()
        self.calls.append(("summarize", document))
        self.gen.append(gen)
        return self._answer()

    # what a summary part by part uses (engine/runtime/summary.py)
    model = SimpleNamespace(
        tokenize=str.split, info=SimpleNamespace(chat_template=None), add_bos=True
    )
    capacity = 1280  # cells: a short document is one part

    def run(self, prompt, **gen):
        self.calls.append(("run", prompt.document))
        self.prompts.append(prompt)
        self.gen.append(gen)
        return self._answer()

    def follow_up(self, question, **gen):
        self.stop.clear()
        self.calls.append(("follow_up", question))
        self.gen.append(gen)
        return self._answer()


class FakeEngine:
    model_name = "Fake 1B"

    def __init__(self, steps: int = 3, delay: float = 0.0) -> None:
        self.steps, self.delay, self.closed = steps, delay, False

        self.sessions: list[FakeSession] = []
        self.kwargs: list[dict] = []  # the keyword arguments of each session() call

    def session(self, policy, budget, **settings):
        self.kwargs.append(settings)
        self.sessions.append(FakeSession(self.steps, self.delay))
        return self.sessions[-1]

    def close(self) -> None:
        self.closed = True


JOB = Job(
    "ask",
    "a document",
    "a question?",
    RequestSpec(policy="snapkv", budget_tokens=256, max_tokens=8),
)


@pytest.fixture
def worker_thread():
    holder: dict[str, object] = {}

    def make(factory):
        holder["w"] = WorkerThread(factory)
        return holder["w"]

    yield make
    if "w" in holder:
        holder["w"].stop()


def test_events_arrive_on_the_gui_thread(qtbot, worker_thread):
    wt = worker_thread(lambda path, layers, threads: FakeEngine())
    with qtbot.waitSignal(wt.results.model_loaded, timeout=5000) as loaded:
        wt.requests.load_model.emit(None, 0, None)
    assert loaded.args == ["Fake 1B"]
    seen: list[tuple[object, bool]] = []
    wt.results.event.connect(
        lambda e: seen.append((e, threading.current_thread() is threading.main_thread()))
    )
    # wait for Done, not busy(False): the load's own busy(False) may still be queued
    with qtbot.waitSignal(
        wt.results.event, timeout=5000, check_params_cb=lambda e: isinstance(e, Done)
    ):
        wt.requests.run.emit(JOB)
    assert [type(e).__name__ for e, _ in seen] == ["Progress"] * 3 + ["Token", "Done"]
    assert all(on_main for _, on_main in seen)


def test_job_kv_type_reaches_engine_session(qtbot, worker_thread):
    engine = FakeEngine()
    wt = worker_thread(lambda path, layers, threads: engine)
    with qtbot.waitSignal(wt.results.model_loaded, timeout=5000):
        wt.requests.load_model.emit(None, 0, None)
    spec = RequestSpec(
        policy="snapkv", budget_tokens=256, policy_settings=(("window", 16),), max_tokens=8
    )
    job = Job("ask", "a document", "q?", replace(spec, kv_type="q8_0"))
    assert job.key() != Job("ask", "a document", "q?", spec).key()
    with qtbot.waitSignal(
        wt.results.event, timeout=5000, check_params_cb=lambda e: isinstance(e, Done)
    ):
        wt.requests.run.emit(job)
    [kwargs] = engine.kwargs
    assert kwargs["kv_type"] == "q8_0" and kwargs["window"] == 16
    assert JOB.spec.kv_type is None  # the engine's default


def test_cancel_stops_a_running_job(qtbot, worker_thread):
    wt = worker_thread(lambda path, layers, threads: FakeEngine(steps=500, delay=0.01))
    with qtbot.waitSignal(wt.results.model_loaded, timeout=5000):
        wt.requests.load_model.emit(None, 0, None)
    with qtbot.waitSignal(wt.results.event, timeout=5000):
        wt.requests.run.emit(JOB)
    start = time.perf_counter()
    with qtbot.waitSignal(wt.results.cancelled, timeout=5000):
        wt.worker.cancel()
    assert time.perf_counter() - start < 1.0


def test_a_stop_right_after_send_stops_the_job(qtbot, worker_thread):
    """Stop pressed before the worker opened the job's session (it is still loading,
    or the job is queued) was lost; now it stops the job as it starts."""
    wt = worker_thread(lambda path, layers, threads: FakeEngine(steps=500, delay=0.01))
    with qtbot.waitSignal(wt.results.model_loaded, timeout=5000):
        wt.requests.load_model.emit(None, 0, None)
    events = []
    wt.results.event.connect(events.append)
    wt.worker.arm()
    with qtbot.waitSignal(wt.results.cancelled, timeout=5000):
        wt.requests.run.emit(JOB)
        wt.worker.cancel()  # before the worker thread took the job
    assert not any(isinstance(e, Done) for e in events)
    with qtbot.waitSignal(wt.results.event, timeout=5000):  # the next job runs
        wt.worker.arm()
        wt.requests.run.emit(JOB)


def test_a_bad_model_is_a_message_and_the_worker_recovers(qtbot, worker_thread):
    calls = []

    def factory(path, layers, threads):
        calls.append(path)
        if path == "broken.gguf":
            raise ModelError("not a GGUF model file: broken.gguf")
        return FakeEngine()

    wt = worker_thread(factory)
    with qtbot.waitSignal(wt.results.failed, timeout=5000) as failed:
        wt.requests.load_model.emit("broken.gguf", 0, None)
    assert failed.args == ["not a GGUF model file: broken.gguf"]
    with qtbot.waitSignal(wt.results.failed, timeout=5000) as failed:
        wt.requests.run.emit(JOB)
    assert failed.args == ["no model is loaded"]
    with qtbot.waitSignal(wt.results.model_loaded, timeout=5000):
        wt.requests.load_model.emit(None, 0, None)


@pytest.mark.slow
def test_real_model_answers_through_the_worker(qtbot, worker_thread):
    wt = worker_thread(None)
    with qtbot.waitSignal(wt.results.model_loaded, timeout=60_000) as loaded:
        wt.requests.load_model.emit(None, 0, None)
    assert loaded.args == ["Gemma 3 270m"]
    done = []
    wt.results.event.connect(lambda e: done.append(e) if isinstance(e, Done) else None)
    job = Job(
        "ask",
        "Clara repaired the bicycle on Tuesday. " * 40,
        "Who repaired the bicycle?",
        RequestSpec(policy="snapkv", budget_tokens=128, max_tokens=8),
    )
    with qtbot.waitSignal(
        wt.results.event, timeout=60_000, check_params_cb=lambda e: isinstance(e, Done)
    ):
        wt.requests.run.emit(job)
    assert done and done[0].stats.evicted_tokens > 0 and done[0].stats.generated_tokens > 0
