"""The rule of a conversation's turn, written once (engine.runtime.chat.turn_events):
``kvtrim chat`` (``Chat.turn``) and the app's worker both go through it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.fakes import JOB, FakeEngine, FakeSession
from helpers.fakes import fake_stats as _stats

from app import worker as worker_module
from app.worker import WorkerThread
from engine import Done
from engine.runtime import chat as chat_module
from engine.runtime.chat import Chat, turn_events
from engine.session.prompts import SUMMARY_INSTRUCTION


def _drain(events) -> None:
    for _ in events:
        pass


def test_a_fresh_session_reads_the_document_and_asks():
    s = FakeSession(1, 0.0)
    reads, events = turn_events(s, "doc", "who?", answer_prefix="It is", system="sys")
    _drain(events)
    assert reads and s.calls == [("ask", "doc|who?")]
    assert s.gen[0]["answer_prefix"] == "It is" and s.gen[0]["system"] == "sys"


def test_a_fresh_session_without_a_question_summarizes_without_the_prefix():
    s = FakeSession(1, 0.0)
    reads, events = turn_events(s, "doc", None, answer_prefix="It is")
    _drain(events)
    assert reads and s.calls == [("run", "doc")]  # a summary of one part (summary.py)
    assert "answer_prefix" not in s.gen[0]


def test_a_session_that_read_the_document_follows_up():
    s = FakeSession(1, 0.0)
    _drain(turn_events(s, "doc", "who?")[1])
    reads, events = turn_events(s, "doc", "and where?", answer_prefix="In")
    _drain(events)
    assert not reads and s.calls[-1] == ("follow_up", "and where?")
    assert s.gen[-1]["answer_prefix"] == "In"
    _drain(turn_events(s, "doc", None)[1])  # a summary after reading is a follow-up
    assert s.calls[-1] == ("follow_up", SUMMARY_INSTRUCTION)


def test_a_stopped_first_read_is_read_again():
    s = FakeSession(3, 0.0)
    _, events = turn_events(s, "doc", "who?")
    next(events)  # one progress event, then the read stops
    reads, events = turn_events(s, "doc", "who?")
    _drain(events)
    assert reads and [c[0] for c in s.calls] == ["ask", "ask"]


@pytest.fixture
def recorded(monkeypatch):
    seen: list[str | None] = []
    real = chat_module.turn_events

    def spy(session, document, question, **kwargs):
        seen.append(question)
        return real(session, document, question, **kwargs)

    monkeypatch.setattr(chat_module, "turn_events", spy)
    monkeypatch.setattr(worker_module, "turn_events", spy)
    return seen


def test_kvtrim_chat_turns_go_through_the_rule(recorded):
    session = FakeSession(1, 0.0)
    session.stats = _stats()
    chat = Chat(session, "doc", max_tokens=8)
    chat.turn("who?")
    chat.turn("and where?")
    assert recorded == ["who?", "and where?"]
    assert [t.reads_document for t in chat.history] == [True, False]


def test_the_app_worker_goes_through_the_rule(qtbot, recorded):
    engine = FakeEngine()
    wt = WorkerThread(lambda path, layers, threads: engine)
    try:
        with qtbot.waitSignal(wt.results.model_loaded, timeout=5000):
            wt.requests.load_model.emit(None, 0, None)
        second = replace(JOB, question="and where?", history=((JOB.question, "forty-two"),))
        for job in (JOB, second):
            with qtbot.waitSignal(
                wt.results.event, timeout=5000, check_params_cb=lambda e: isinstance(e, Done)
            ):
                wt.requests.run.emit(job)
        assert recorded == [JOB.question, "and where?"]
        assert len(engine.sessions) == 1
        assert [c[0] for c in engine.sessions[0].calls] == ["ask", "follow_up"]
    finally:
        wt.stop()
