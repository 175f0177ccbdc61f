"""Chat behaviour in the window with a fake engine: follow-ups continue the cache,
a settings change re-reads the transcript, Regenerate, Copy, the settings panel,
model reloads, graphs at 2 Hz and the theme."""

from __future__ import annotations

import itertools
import time

import pytest
from helpers.fakes import FakeEngine

from app.settings import Settings, load
from app.store import Store
from app.window import MainWindow
from app.worker import WorkerThread


class Engines:
    """A factory that records each load and fails for paths ending in 'bad.gguf'."""

    def __init__(self, steps: int = 2, delay: float = 0.0) -> None:
        self.steps, self.delay = steps, delay
        self.loads: list[object] = []
        self.current: FakeEngine | None = None

    def __call__(self, path, layers, threads):
        self.loads.append(path)
        if path and str(path).endswith("bad.gguf"):
            from engine import ModelError

            raise ModelError(f"not a GGUF model file: {path}")
        self.current = FakeEngine(self.steps, self.delay)
        self.current.model_name = f"Fake ({path or 'default'})"
        return self.current


def _open(qtbot, tmp_path, engines, settings=None):
    w = MainWindow(
        WorkerThread(engines),
        Store(tmp_path / "h.sqlite3"),
        settings or Settings(),
        tmp_path / "settings.json",
    )
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.model_name.startswith("Fake"), timeout=5000)
    return w


def _ask(qtbot, w, text):
    n = len(w.store.messages(w.conversation.id)) if w.conversation else 0
    w.input.setPlainText(text)
    w.send()
    qtbot.waitUntil(
        lambda: len(w.store.messages(w.conversation.id)) == n + 2 and not w.busy, timeout=5000
    )


@pytest.fixture
def engines():
    return Engines()


def test_follow_ups_continue_the_same_session(qtbot, tmp_path, engines):
    w = _open(qtbot, tmp_path, engines)
    _ask(qtbot, w, "first?")
    _ask(qtbot, w, "second?")
    assert len(engines.current.sessions) == 1
    assert [c[0] for c in engines.current.sessions[0].calls] == ["ask", "follow_up"]
    w.panel.set_policy("h2o")  # a new setting: the transcript is read again
    _ask(qtbot, w, "third?")
    assert len(engines.current.sessions) == 2
    assert engines.current.sessions[0].closed
    method, text = engines.current.sessions[1].calls[0]
    assert method == "ask"
    assert "Question: first?\nAnswer: forty-two" in text
    assert "Question: second?\nAnswer: forty-two" in text and text.endswith("|third?")
    w.close()


def test_a_changed_kv_type_reads_the_transcript_again(qtbot, tmp_path, engines):
    w = _open(qtbot, tmp_path, engines)
    assert w.panel.kv_type_name() == "f16" and "· KV" not in w.status_line.text()
    _ask(qtbot, w, "first?")
    w.panel.kv_type.setCurrentIndex(w.panel.kv_type.findData("q8_0"))
    assert load(tmp_path / "settings.json").kv_type == "q8_0"
    assert w.status_line.text().endswith("· KV q8_0")
    _ask(qtbot, w, "second?")  # not a follow-up: the old cache is f16
    assert len(engines.current.sessions) == 2 and engines.current.sessions[0].closed
    assert [k["kv_type"] for k in engines.current.kwargs] == ["f16", "q8_0"]
    assert engines.current.sessions[1].calls[0][0] == "ask"
    assert "Question: first?\nAnswer: forty-two" in engines.current.sessions[1].calls[0][1]
    _ask(qtbot, w, "third?")  # same type again: continues
    assert len(engines.current.sessions) == 2
    assert [c[0] for c in engines.current.sessions[1].calls] == ["ask", "follow_up"]
    w.close()


def test_regenerate_replaces_the_last_answer_and_copy(qtbot, tmp_path, engines):
    w = _open(qtbot, tmp_path, engines)
    _ask(qtbot, w, "what?")
    before = w.store.messages(w.conversation.id)
    w.regenerate()
    assert w.answering.replacing == before[-1].id
    qtbot.waitUntil(lambda: w.answering.replacing is None and not w.busy, timeout=5000)
    after = w.store.messages(w.conversation.id)
    assert [m.role for m in after] == ["user", "assistant"]
    assert after[-1].id == before[-1].id and after[-1].created_s == before[-1].created_s
    session = engines.current.sessions[-1]
    assert len(engines.current.sessions) == 2 and session.calls[0][0] == "ask"
    assert session.gen[0]["system"] == "" and session.calls[0][1].endswith("|what?")
    assert session.gen[0]["sampling"].temperature > 0  # a new answer, not the same one
    w.copy_answer()
    from PySide6.QtWidgets import QApplication

    assert QApplication.clipboard().text() == "forty-two"
    w.close()


def test_summarize_then_chat_about_it(qtbot, tmp_path, engines):
    doc = tmp_path / "notes.md"
    doc.write_text("# Notes\n\nClara repaired the bicycle.")
    other = tmp_path / "more.txt"
    other.write_text("Bob sold the kettle.")
    settings = Settings(system_prompt="Answer in English.")
    w = _open(qtbot, tmp_path, engines, settings)
    assert w.attach(doc) and w.attach(other)
    assert "notes.md, more.txt" in w.doc_label.text()
    w.summarize()
    qtbot.waitUntil(
        lambda: not w.busy and len(w.store.messages(w.conversation.id)) == 2, timeout=5000
    )
    _ask(qtbot, w, "who sold it?")
    s = engines.current.sessions[0]
    assert [c[0] for c in s.calls] == ["run", "follow_up"]  # a summary of one part
    assert "# notes.md" in s.calls[0][1] and "Bob sold the kettle." in s.calls[0][1]
    assert s.prompts[0].prefix.startswith("Answer in English.")
    assert "tok/s" in w.chat.toPlainText()  # the figures under each answer
    w.close()


def test_settings_panel_persists_policy_parameters(qtbot, tmp_path, engines):
    w = _open(qtbot, tmp_path, engines)
    w.panel.set_policy("snapkv")
    assert list(w.panel.params) == ["n_sink", "recent", "window", "kernel"]  # its fields
    w.panel.params["n_sink"].setValue(8)
    w.panel.set_policy("h2o")
    assert list(w.panel.params) == ["n_sink", "recent", "recent_ratio"]
    assert "recent share" in w.panel.policy_params.hints["recent"].text()
    assert w.panel.params["n_sink"].value() == 0  # H2O's own default
    w.panel.params["recent_ratio"].setValue(0.25)
    assert dict(w.panel.policy_settings())["recent_ratio"] == 0.25
    w.panel.set_policy("snapkv")
    assert w.panel.params["n_sink"].value() == 8
    assert dict(w.panel.policy_settings()) == {"n_sink": 8, "recent": 32, "window": 32,
                                               "kernel": 7}  # fmt: skip
    saved = load(tmp_path / "settings.json")
    assert saved.policy == "snapkv"
    assert saved.policy_params == {"snapkv": {"n_sink": 8}, "h2o": {"recent_ratio": 0.25}}
    w.close()


def test_model_reload_and_a_bad_model_keeps_the_old_one(qtbot, tmp_path, engines):
    w = _open(qtbot, tmp_path, engines)
    w.panel.model_path.setText(str(tmp_path / "other.gguf"))
    w.panel.gpu_layers.setValue(12)
    assert w.panel.reload_button.isEnabled()
    w.panel.reload_button.click()
    qtbot.waitUntil(lambda: "other.gguf" in w.model_name, timeout=5000)
    assert load(tmp_path / "settings.json").gpu_layers == 12
    w.panel.model_path.setText(str(tmp_path / "bad.gguf"))
    w.panel.reload_button.click()
    qtbot.waitUntil(lambda: "not a GGUF model file" in w.error.text(), timeout=5000)
    qtbot.waitUntil(lambda: not w.busy, timeout=5000)
    assert "kept" in w.error.text() and "other.gguf" in w.model_name
    _ask(qtbot, w, "still working?")  # the previous model answers
    assert engines.loads[-1] == str(tmp_path / "other.gguf")
    w.close()


def test_graphs_sample_at_least_twice_a_second_while_working(qtbot, tmp_path):
    engines = Engines(steps=40, delay=0.05)  # a 2-second prefill with 40 progress events
    w = _open(qtbot, tmp_path, engines)
    w.input.setPlainText("slow?")
    start = time.monotonic()
    w.send()
    qtbot.waitUntil(lambda: w.busy, timeout=5000)
    qtbot.waitUntil(lambda: not w.busy, timeout=10_000)
    elapsed = time.monotonic() - start
    times = [s[0] for s in w.graphs.samples]
    assert len(times) >= 2 * elapsed
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.6
    assert len(w.graphs.memory) >= 2 and "No NVIDIA GPU" in w.graphs.memory_label.text()
    w.close()


def test_dark_theme_follows_the_setting(qtbot, tmp_path, engines):
    from PySide6.QtWidgets import QApplication

    w = _open(qtbot, tmp_path, engines, Settings(theme="dark"))
    assert QApplication.instance().palette().window().color().lightness() < 80
    w.panel.theme.setCurrentIndex(w.panel.theme.findData("light"))
    assert QApplication.instance().palette().window().color().lightness() > 180
    assert load(tmp_path / "settings.json").theme == "light"
    w.close()


def test_gpu_layers_on_a_build_without_gpu_say_so(qtbot, tmp_path):
    import types

    def factory(path, layers, threads):
        engine = FakeEngine()
        note = f"{layers} GPU layers asked for, but ... runs on the CPU" if layers else None
        engine.model = types.SimpleNamespace(device_note=note)
        engine.notes = (note,) if note else ()
        return engine

    w = MainWindow(WorkerThread(factory), Store(tmp_path / "h.sqlite3"), Settings(gpu_layers=20))
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: "runs on the CPU" in w.error.text(), timeout=5000)
    _ask(qtbot, w, "works anyway?")
    w.close()


def test_answer_prefix_steers_and_starts_the_answer(qtbot, tmp_path, engines):
    w = _open(qtbot, tmp_path, engines, Settings(answer_prefix="The pass key is"))
    _ask(qtbot, w, "What is the pass key?")
    _ask(qtbot, w, "And again?")
    s = engines.current.sessions[0]
    assert [g["answer_prefix"] for g in s.gen] == ["The pass key is"] * 2
    answers = [m.content for m in w.store.messages(w.conversation.id) if m.role == "assistant"]
    assert answers == ["The pass key is forty-two"] * 2
    w.panel.answer_prefix.setText("")
    assert load(tmp_path / "settings.json").answer_prefix == ""
    w.close()


def test_out_of_memory_is_a_message_and_the_next_message_works(qtbot, tmp_path):
    from engine import OutOfMemoryError

    class Tight(FakeEngine):
        def session(self, policy, budget, **settings):
            if budget > 4096:
                raise OutOfMemoryError(
                    f"could not allocate a KV cache of {budget} cells; try a smaller --budget"
                )
            return super().session(policy, budget)

    w = MainWindow(
        WorkerThread(lambda p, layers, t: Tight()),
        Store(tmp_path / "h.db"),
        Settings(budget_tokens=65536),
    )
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.model_name == "Fake 1B", timeout=5000)
    w.input.setPlainText("a long one?")
    w.send()
    qtbot.waitUntil(lambda: "smaller" in w.error.text(), timeout=5000)
    qtbot.waitUntil(lambda: not w.busy, timeout=5000)
    w.panel.budget.setValue(1024)
    _ask(qtbot, w, "and now?")
    assert w.store.messages(w.conversation.id)[-1].content == "forty-two"
    w.close()
