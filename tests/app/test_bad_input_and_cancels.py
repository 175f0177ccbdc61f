"""Bad input, cancellation, crash and memory hardening: every bad document and
model file gives one clear line through the loaders, the CLI, the server and the
GUI adapter; nothing crashes the process or the native library."""

from __future__ import annotations

import errno
import gc
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest
from helpers import bad_inputs
from helpers.docs_for_tests import prose
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Cancelled, DocumentError, Engine, Progress, Session, Token
from engine.cli.main import main as cli_main
from engine.documents.load import SUFFIXES, load_document

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return bad_inputs.documents(tmp_path_factory.mktemp("bad-docs"))


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    return bad_inputs.models(tmp_path_factory.mktemp("bad-models"))


def test_every_bad_document_is_one_clear_line_from_the_loader(corpus):
    for name, (path, expect) in corpus.items():
        if expect is None:
            text = load_document(path)
            assert isinstance(text, str) and text.strip(), name
            continue
        with pytest.raises(DocumentError) as info:
            load_document(path)
        message = str(info.value)
        assert expect in message and "\n" not in message, (name, message)
    assert "Café crème brûlée" in load_document(corpus["cp1252.txt"][0])


def test_a_file_that_disappears_while_read(tmp_path, monkeypatch):
    doc = tmp_path / "going.txt"
    doc.write_text("soon gone")
    real_open = os.open

    def vanish(path: object, *args: object) -> int:
        if Path(str(path)) == doc:
            doc.unlink()
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", vanish)
    with pytest.raises(DocumentError, match="not found"):
        load_document(doc)

    doc.write_text("back again")

    def io_error(path: object, *args: object) -> int:
        if Path(str(path)) == doc:
            raise OSError(errno.EIO, "Input/output error")
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", io_error)
    with pytest.raises(DocumentError, match="Input/output error"):
        load_document(doc)


def test_bad_documents_through_the_cli(corpus):
    for name, (path, expect) in corpus.items():
        if expect is None:
            continue
        out, err = io.StringIO(), io.StringIO()
        code = cli_main(["ask", str(path), "-q", "What?"], out, err)
        assert code == 2, name
        line = err.getvalue()
        assert line.startswith("kvtrim: error:") and line.count("\n") == 1, (name, line)
        assert expect in line, (name, line)


def test_bad_documents_through_the_gui_adapter(qtbot, tmp_path, corpus):
    from helpers.fakes import FakeEngine

    from app.settings import Settings
    from app.store import Store
    from app.window import MainWindow
    from app.worker import WorkerThread

    w = MainWindow(
        WorkerThread(lambda p, layers, t: FakeEngine()), Store(tmp_path / "h.db"), Settings()
    )
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.model_name == "Fake 1B", timeout=5000)
    for name, (path, expect) in corpus.items():
        w.documents = []
        ok = w.attach(path)
        if expect is None:
            assert ok and w.documents, name
        else:
            assert not ok and expect in w.error.text() and "\n" not in w.error.text(), name
    w.input.setPlainText("still usable?")
    w.send()
    qtbot.waitUntil(lambda: not w.busy and "forty-two" in w.chat.toPlainText(), timeout=5000)
    w.close()


@pytest.mark.slow
def test_bad_models_through_cli_server_and_gui(qtbot, bad_models, tmp_path):
    from app.worker import WorkerThread

    worker = WorkerThread()  # the real engine factory
    messages: list[str] = []
    worker.results.failed.connect(messages.append)
    try:
        for name, (path, expect) in bad_models.items():
            for command in (["info"], ["serve", "--port", "0"]):
                err = io.StringIO()
                code = cli_main([*command, "--model", str(path)], io.StringIO(), err)
                assert code == 2 and expect in err.getvalue(), (name, command, err.getvalue())
                assert err.getvalue().count("\n") == 1
            with qtbot.waitSignal(worker.results.failed, timeout=30_000):
                worker.requests.load_model.emit(str(path), 0, None)
            assert expect in messages[-1] and "\n" not in messages[-1], (name, messages[-1])
        with qtbot.waitSignal(worker.results.model_loaded, timeout=60_000):
            worker.requests.load_model.emit(None, 0, None)  # and the app goes on
    finally:
        worker.stop()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=4096), suffix=st.sampled_from(SUFFIXES))
def test_loaders_never_fail_otherwise(tmp_path, data, suffix):
    """Fuzz: any bytes under any supported name give text or a one-line DocumentError."""
    path = tmp_path / f"fuzz{suffix}"
    path.write_bytes(data)
    try:
        text = load_document(path)
    except DocumentError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(text, str) and text.strip()


@given(text=st.text(max_size=2000))
@settings(max_examples=60, deadline=None)
def test_plain_text_of_any_unicode_loads_or_is_refused_clearly(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("u") / "t.txt"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        out = load_document(path)
    except DocumentError as exc:
        assert any(w in str(exc) for w in ("empty", "binary", "encoding", "no text"))
    else:
        assert out.strip()


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_fifty_cancels_in_prefill_and_in_decoding_leave_memory_flat(engine):
    long_doc = prose(150, seed=9)  # about 1,900 tokens: cancelled long before the end
    short_doc = prose(8, seed=9)  # decoding starts at once
    with engine.session("snapkv", 128) as s:

        def cancel_after(kind: type) -> None:
            doc = long_doc if kind is Progress else short_doc
            events = s.ask(doc, "Who sold the kettle?", max_tokens=200)
            with pytest.raises(Cancelled):
                for event in events:
                    if isinstance(event, kind):
                        s.cancel()

        for kind in (Progress, Token):  # warm up both paths once
            cancel_after(kind)
        before = _rss()
        for _ in range(50):
            cancel_after(Progress)
            cancel_after(Token)
        after = _rss()
        result = Session.collect(s.ask(prose(20), "Who sold the kettle?", max_tokens=4))
    assert result.stats.generated_tokens > 0, "the session still works"
    assert after < before * 1.03 + 8 * 2**20, (before >> 20, after >> 20)


def test_cancel_from_another_thread_in_a_loop(engine):
    doc = prose(150, seed=10)
    with engine.session("h2o", 128) as s:
        for _ in range(10):
            started = threading.Event()
            raised: list[BaseException] = []

            def work(started: threading.Event = started, raised: list = raised) -> None:
                try:
                    for _event in s.ask(doc, "Who?", max_tokens=50):
                        started.set()
                except BaseException as exc:
                    raised.append(exc)
                started.set()

            t = threading.Thread(target=work)
            t.start()
            started.wait(10)
            s.cancel()
            t.join(10)
            assert not t.is_alive() and (not raised or isinstance(raised[0], Cancelled))


@pytest.mark.slow
def test_switching_models_frees_memory():
    """Five load-use-close cycles: RSS falls back after each close and does not grow."""
    closed = []
    for _ in range(5):
        eng = Engine()
        with eng.session("snapkv", 512) as s:
            Session.collect(s.ask(prose(30), "Who?", max_tokens=2))
        loaded = _rss()
        eng.close()
        del eng
        closed.append(_rss())
        assert loaded - closed[-1] > 150 * 2**20, "closing a model gives its memory back"
    assert closed[-1] < closed[1] + 16 * 2**20, [c >> 20 for c in closed]


@pytest.mark.slow
def test_a_cache_that_cannot_be_allocated_is_a_clear_message(tmp_path):
    """Under a 1.5 GB address-space limit, a 24,000-token budget with every layer at full
    length (30,208 cells, 531 MB of KV on top of the model and libraries) cannot be
    allocated: one line that suggests a smaller budget, no crash. The document is longer
    than the budget, since a shorter one only gets the cells it needs."""
    doc = tmp_path / "d.txt"
    doc.write_text(prose(3000))
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))\n"
        "from engine.cli.main import main\n"
        f"sys.exit(main(['ask', {str(doc)!r}, '-q', 'Who?', '--budget', '24000', "
        "'--swa-cache', 'full']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("kvtrim:")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "smaller" in lines[0] and "budget" in lines[0], proc.stderr


def test_sigkill_during_settings_writes_never_leaves_a_bad_file(tmp_path):
    path = tmp_path / "settings.json"
    code = (
        "import sys\n"
        "from app.settings import Settings, save\n"
        f"path = __import__('pathlib').Path({str(path)!r})\n"
        "i = 0\n"
        "while True:\n"
        "    save(Settings(budget_tokens=64 + i % 4096, system_prompt='x' * (i % 5000)), path)\n"
        "    i += 1\n"
        "    if i == 50: print('writing', flush=True)\n"
    )
    from app.settings import SCHEMA_VERSION, load

    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        proc.kill()
        proc.wait(10)
        raw = json.loads(path.read_text())  # always a whole file, never half of one
        assert raw["schema"] == SCHEMA_VERSION and raw["budget_tokens"] >= 64
        assert load(path).budget_tokens == raw["budget_tokens"]
    leftovers = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) <= 3  # at most one temporary file per kill, never read


def test_server_survives_hostile_bodies(engine):
    from fastapi.testclient import TestClient

    from engine.serve.api import ServerConfig, create_app

    app = create_app(engine, ServerConfig(budget_tokens=128, parallel=1))
    with TestClient(app, base_url="http://localhost") as client:  # a loopback Host
        cases = [
            (b"\xff\xfe\x00binary", 400),
            (json.dumps({"prompt": "\ud800 lone surrogate", "max_tokens": 2}).encode(), 200),
            (json.dumps({"prompt": "x", "max_tokens": 10**12}).encode(), 400),
            (json.dumps({"prompt": "x", "temperature": "hot"}).encode(), 400),
            (json.dumps({"prompt": "", "max_tokens": 2}).encode(), 200),  # from BOS, as OpenAI
            (json.dumps({"messages": []}).encode(), 404),  # wrong endpoint for chat
            (json.dumps([1, 2, 3]).encode(), 400),
        ]
        for body, status in cases:
            url = "/v1/chat/completions/x" if status == 404 else "/v1/completions"
            r = client.post(url, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == status, (body[:40], r.status_code, r.text[:200])
            if status != 200:
                assert set(r.json()["error"]) >= {"message", "type", "code"}, r.text
        ok = client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert ok.status_code == 200


def test_a_cancel_while_the_prompt_is_tokenized_is_not_lost(engine, monkeypatch):
    """Issue 23 FAIL 7: the first Ctrl+C during the tokenizing of a 16 MB document was
    lost (run_tokens cleared the cancel event after it) and the read went on."""
    with engine.session("snapkv", 256) as s:
        real = s.model.tokenize

        def tokenize_then_ctrl_c(text, **kwargs):
            tokens = real(text, **kwargs)
            if len(text) > 1000:  # the document: Ctrl+C comes while it is tokenized
                s.cancel()
            return tokens

        monkeypatch.setattr(s.model, "tokenize", tokenize_then_ctrl_c)
        events = s.ask("The pass key is 4242. " * 200, "What is the pass key?", max_tokens=4)
        monkeypatch.setattr(s.model, "tokenize", real)
        with pytest.raises(Cancelled):
            for _ in events:
                pass
        result = Session.collect(s.ask("The key is 7.", "What is the key?", max_tokens=4))
        assert result.reason in ("stop", "length", "eog")  # the next run is not cancelled
