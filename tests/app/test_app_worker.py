"""The engine worker in its QThread: events arrive as queued signals, errors as
messages, cancel works; a fake engine for most, the real model for one."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from helpers.fakes import JOB, FakeEngine

from app.worker import Job, WorkerThread
from engine import Done, ModelError
from engine.runtime.spec import RequestSpec


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
