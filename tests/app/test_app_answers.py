"""Issue 22, findings 1 and 2 in the window: answers shown as written in the chat view
(reopened history), the answer's stage shown at once, every answer's meta line ending
with why it stopped, and max tokens, temperature and the budget in the settings panel
with the CLI's values and ranges. The export: tests/app/test_transcript.py."""

from __future__ import annotations

import threading

import pytest
from helpers.app_windows import open_window as _window
from helpers.fakes import FakeEngine, FakeSession
from helpers.fakes import fake_stats as _stats
from helpers.transcripts import SHAPES
from helpers.transcripts import chat_with as _chat_with
from helpers.transcripts import reader_lines as _lines
from helpers.transcripts import text_blocks as _blocks

from app.settings import Settings, load
from app.store import Store
from app.window import MainWindow
from engine import Cancelled, Done, Progress, Recalled, Token


@pytest.mark.parametrize("name", list(SHAPES))
def test_a_bare_answer_is_text_in_the_chat_after_its_speaker(qtbot, tmp_path, name):
    """ "48213." once became a list marker in the left margin, cut to "8213.", drawn
    before the speaker label; now the label comes first and the text is the block."""
    answer, shown = SHAPES[name]
    store = Store(tmp_path / "h.sqlite3")
    _chat_with(store, [answer])
    w = _window(qtbot, tmp_path)  # the stored history, reopened
    w.close()
    store.close()
    texts = _lines(w.chat.document())
    at = texts.index("kvtrim")
    assert texts[at + 1 : at + 1 + len(shown)] == shown
    assert not any(b.textList() for b in _blocks(w.chat.document()))
    assert texts[at + 1 + len(shown)].startswith("1.0 tok/s")


def test_lists_code_and_tables_the_model_wrote_keep_their_shape(qtbot, tmp_path):
    answer = (
        "Here they are:\n\n1. apples\n2. pears\n\n```python\nprint('<b>hi</b>')\n```\n\n"
        "| key | page |\n|---|---|\n| 48213 | 1 |\n\n- one\n- two"
    )
    store = Store(tmp_path / "h.sqlite3")
    _chat_with(store, [answer])
    w = _window(qtbot, tmp_path)
    doc = w.chat.document()
    texts = _lines(doc)
    assert [t for t in texts if t[:3] in ("1. ", "2. ")] == ["1. apples", "2. pears"]
    assert [t for t in texts if t.startswith("•")] == ["• one", "• two"]
    assert "print('<b>hi</b>')" in texts
    code = doc.find("print(").charFormat()
    assert code.fontFixedPitch() or "mono" in str(code.fontFamilies()).lower()
    cursor = doc.find("48213")
    table = cursor.currentTable()
    assert table is not None and (table.rows(), table.columns()) == (2, 2)
    w.close()


class Gated(FakeSession):
    """Yields ``events`` one at a time, each once the test lets it through."""

    def __init__(self, events: list) -> None:
        super().__init__(0, 0.0)
        self.events = events
        self.gate = threading.Semaphore(0)

    def _answer(self):
        self.stop.clear()
        for event in self.events:
            while not self.gate.acquire(timeout=0.05):
                if self.stop.is_set():
                    raise Cancelled("cancelled")
            yield event
        self.read = True


class GatedEngine(FakeEngine):
    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events

    def session(self, policy, budget, **settings):
        self.kwargs.append(settings)
        self.sessions.append(Gated(list(self.events)))
        return self.sessions[-1]


def _session(qtbot, engine: GatedEngine, n: int) -> Gated:
    """The engine's ``n``th session, once the worker has opened it."""
    qtbot.waitUntil(lambda: len(engine.sessions) >= n, timeout=5000)
    return engine.sessions[n - 1]


def _last_lines(w: MainWindow, n: int = 2) -> list[str]:
    return w.chat.toPlainText().strip().splitlines()[-n:]


def test_the_answer_shows_its_stage_from_the_moment_of_send(qtbot, tmp_path):
    stats = _stats()
    engine = GatedEngine(
        [
            Progress(512, 8876, stats),
            Progress(8876, 8876, stats),
            Recalled(("a passage",), 256, stats),
            Token(1, "forty", stats),
            Token(2, "-two", stats),
            Done("forty-two", "eog", stats),
        ]
    )
    w = _window(qtbot, tmp_path, engine)
    w.input.setPlainText("What is it?")
    w.send()  # before any event loop turn: the placeholder is there already
    assert _last_lines(w) == ["kvtrim", "reading…"]
    w.input.setPlainText("And again?")
    w.send()  # a second Send while the first is on its way does nothing
    assert w.input.toPlainText() == "And again?"
    assert [m.role for m in w.store.messages(w.conversation.id)] == ["user"]
    session = _session(qtbot, engine, 1)
    for shown in (
        "reading 512 / 8,876 tokens",
        "writing…",
        "bringing back 256 tokens",
        "forty▍",
        "forty-two▍",
    ):
        session.gate.release()
        qtbot.waitUntil(lambda shown=shown: _last_lines(w)[-1] == shown, timeout=5000)
    session.gate.release()
    qtbot.waitUntil(lambda: not w.busy and w.answering.pending is None, timeout=5000)
    answer = w.store.messages(w.conversation.id)[-1]
    assert answer.content == "forty-two" and answer.meta.endswith(" · end of answer")
    w.close()


def test_summarize_and_regenerate_show_their_stage_at_once(qtbot, tmp_path):
    engine = GatedEngine([Token(1, "fine", _stats()), Done("fine", "length", _stats())])
    w = _window(qtbot, tmp_path, engine)
    doc = tmp_path / "notes.txt"
    doc.write_text("Clara repaired the bicycle.")
    assert w.attach(doc)
    w.summarize()
    assert _last_lines(w, 3) == ["Summarize notes.txt", "kvtrim", "reading…"]
    for _ in range(2):
        _session(qtbot, engine, 1).gate.release()
    qtbot.waitUntil(lambda: not w.busy and w.answering.pending is None, timeout=5000)
    assert w.store.messages(w.conversation.id)[-1].meta.endswith(" · max tokens reached")
    w.regenerate()  # the old answer gives way to the stage of the new one
    assert _last_lines(w, 3) == ["Summarize notes.txt", "kvtrim", "reading…"]
    qtbot.waitUntil(lambda: w.worker.worker._session is not None, timeout=5000)
    w.stop()  # stopped before its first token: the old answer stays
    qtbot.waitUntil(lambda: not w.busy and w.answering.pending is None, timeout=5000)
    # the summary's one part was cut by max tokens: its words as written, with "…"
    summary = "Fine…"  # kvtrim's cue ("This section describes") is not shown
    assert w.store.messages(w.conversation.id)[-1].content == summary
    assert _last_lines(w, 3)[:2] == ["kvtrim", summary]
    w.close()


def test_a_stopped_answer_says_stopped(qtbot, tmp_path):
    engine = GatedEngine([Token(1, "half an", _stats()), Done("never", "eog", _stats())])
    w = _window(qtbot, tmp_path, engine)
    w.input.setPlainText("Long one?")
    w.send()
    _session(qtbot, engine, 1).gate.release()
    qtbot.waitUntil(lambda: "half an▍" in w.chat.toPlainText(), timeout=5000)
    w.stop()  # the session is running: it has sent a token
    qtbot.waitUntil(lambda: not w.busy and w.answering.pending is None, timeout=5000)
    answer = w.store.messages(w.conversation.id)[-1]
    assert (answer.content, answer.meta) == ("half an", "stopped")
    assert w.error.text() == "Stopped."
    w.close()


@pytest.mark.parametrize(
    ("reason", "words"),
    [
        ("eog", "end of answer"),
        ("length", "max tokens reached"),
        ("stop", "stop string"),
        ("repetition", "stopped a repeating loop"),
    ],
)
def test_every_meta_line_ends_with_its_stop_reason(reason, words):
    from app.answering import meta_line

    assert meta_line(_stats(), reason).endswith(f" · {words}")


def test_stage_words():
    from app.answering import stage

    stats = _stats()
    assert stage(Progress(512, 8876, stats)) == "reading 512 / 8,876 tokens"
    assert stage(Progress(8876, 8876, stats)) == "writing…"
    assert stage(Recalled(("x",), 256, stats)) == "bringing back 256 tokens"
    assert stage(Token(1, "a", stats)) is None


def test_max_tokens_temperature_and_budget_are_settings_with_the_cli_ranges(qtbot, tmp_path):
    from engine.cli.main import build_parser

    cli = build_parser().parse_args(["ask", "doc.txt", "-q", "?"])
    default = Settings()
    assert (default.budget_tokens, default.max_tokens, default.temperature) == (
        cli.budget_tokens,
        cli.max_tokens,
        cli.temperature,
    )
    engine = FakeEngine()
    w = _window(qtbot, tmp_path, engine, path=tmp_path / "settings.json")
    numbers = w.panel.numbers
    assert (numbers["budget_tokens"].minimum(), numbers["max_tokens"].minimum()) == (16, 1)
    temperature = numbers["temperature"]
    assert (temperature.minimum(), temperature.maximum()) == (0.0, 2.0)
    numbers["max_tokens"].setValue(64)
    temperature.setValue(0.5)
    numbers["budget_tokens"].setValue(16)
    saved = load(tmp_path / "settings.json")
    assert (saved.max_tokens, saved.temperature, saved.budget_tokens) == (64, 0.5, 16)
    w.input.setPlainText("q?")
    w.send()
    qtbot.waitUntil(lambda: not w.busy and w.answering.pending is None, timeout=5000)
    gen = engine.sessions[-1].gen[-1]
    assert gen["max_tokens"] == 64 and gen["sampling"].temperature == 0.5
    w.close()
    reopened = _window(qtbot, tmp_path / "again", settings=load(tmp_path / "settings.json"))
    assert reopened.panel.numbers["max_tokens"].value() == 64
    assert reopened.panel.numbers["temperature"].value() == 0.5
    reopened.close()
