"""kvtrim chat: JSON-lines script mode, recall after eviction, the interactive loop
with stopped answers, and one-line errors. One thread each: the tests share 2 cores."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.docs_for_tests import prose

from engine.cli.chat import interactive, parse_line
from engine.cli.chat import main as chat_main
from engine.cli.main import main, parse_args
from engine.policies import make_policy
from engine.runtime.chat import Chat
from engine.session.core import Session, SessionConfig
from engine.session.prompts import SUMMARY_INSTRUCTION

FIELDS = {
    "turn",
    "kind",
    "question",
    "answer",
    "reason",
    "seconds",
    "cells_used",
    "kv_bytes",
    "kv_bytes_llama_default",
    "tokens_seen",
    "evicted_tokens",
    "recalled_tokens",
    "recalled_excerpts",
    "recall_host_bytes",
    "rss_bytes",
}
FAST = ["--budget", "256", "--threads", "1"]


@pytest.fixture
def short_doc(tmp_path: Path) -> Path:
    p = tmp_path / "short.txt"
    p.write_text(prose(20, seed=8), encoding="utf-8")
    return p


def _chat(argv: list[str], stdin: str = "") -> tuple[int, list[dict], str]:
    out, err = io.StringIO(), io.StringIO()
    code = chat_main(parse_args(["chat", *argv]), out, err, inp=io.StringIO(stdin))
    return code, [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


@pytest.mark.slow
def test_script_on_stdin_prints_a_json_line_per_turn_and_per_bad_line(short_doc):
    lines = [
        '{"summarize": true}',
        "",
        "not json",
        '{"question": "Who?", "colour": "red"}',
        '{"question": "Who repaired the bicycle?", "answer_prefix": "It was"}',
    ]
    code, rows, err = _chat([str(short_doc), *FAST, "--max-tokens", "6"], "\n".join(lines))
    assert code == 1, err  # a line failed, the others ran
    assert [r.get("turn") for r in rows] == [1, None, None, 2]
    summary, bad_json, unknown, answer = rows
    assert set(summary) >= FIELDS and set(answer) >= FIELDS
    assert summary["kind"] == "summarize" and summary["reads_document"]
    assert answer["kind"] == "question" and not answer["reads_document"]  # a follow-up
    assert answer["question"] == "Who repaired the bicycle?"
    assert answer["answer"].startswith("It was")
    assert bad_json == {"line": 3, "error": bad_json["error"]} and "not JSON" in bad_json["error"]
    assert unknown["line"] == 4 and "unknown key 'colour'" in unknown["error"]
    for r in (summary, answer):
        assert r["reason"] in ("stop", "length", "eog") and r["seconds"] > 0
        assert r["kv_bytes"] > 0 and r["cells_used"] <= r["tokens_seen"]
        assert r["rss_bytes"] > 50 << 20 and r["recalled_excerpts"] == []
    assert answer["tokens_seen"] > summary["tokens_seen"]


@pytest.mark.slow
def test_follow_up_after_eviction_brings_back_the_planted_fact(tmp_path):
    doc = tmp_path / "haystack.txt"
    doc.write_text(prose(8, seed=3) + " The pass key is 48213. Remember it. " + prose(50, seed=5))
    script = tmp_path / "turns.jsonl"
    script.write_text(
        '{"summarize": true}\n'
        '{"question": "What is the pass key?", "answer_prefix": "The pass key is"}\n'
    )
    page = tmp_path / "kept.html"
    argv = [str(doc), *FAST, "--recall-tokens", "128", "--max-tokens", "8"]
    code, rows, err = _chat([*argv, "--script", str(script), "--show-kept", str(page)])
    assert code == 0, err
    summary, answer = rows
    assert summary["evicted_tokens"] > 0 and summary["recalled_tokens"] == 0
    assert summary["kv_bytes"] < summary["kv_bytes_llama_default"]
    assert answer["recalled_tokens"] > 0 and answer["recall_host_bytes"] > 0
    assert answer["recalled_excerpts"] and all(len(t) <= 200 for t in answer["recalled_excerpts"])
    assert "48213" in answer["answer"], answer
    assert "What is the pass key?" in page.read_text()


@pytest.mark.parametrize(
    "line, message",
    [
        ("[1]", "JSON object"),
        ('{"summarize": false}', "must be true"),
        ('{"summarize": true, "question": "Why?"}', "alone"),
        ('{"question": "  "}', "non-empty"),
        ('{"question": "Why?", "answer_prefix": 3}', "string"),
        ('{"question": "Why?", "b": 1, "a": 2}', "unknown key 'a', 'b'"),
        ("[" * 100_000, "nested too deeply"),  # issue 23: a RecursionError traceback
    ],
)
def test_bad_script_lines_say_what_is_wrong(line, message):
    with pytest.raises(ValueError, match=message):
        parse_line(line)


class _Stream(io.StringIO):
    """A terminal stand-in that presses Ctrl+C (raises SIGINT) at the first write
    ``press`` accepts."""

    def __init__(self, tty: bool = False) -> None:
        super().__init__()
        self.tty = tty
        self.press: Callable[[str], bool] | None = None

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.press is not None and self.press(text):
            self.press = None
            signal.raise_signal(signal.SIGINT)  # the turn's handler cancels the session
        return n


def test_interactive_survives_stopped_turns_and_answers_the_next(engine, tmp_path):
    config = SessionConfig(budget_tokens=256, n_threads=1)
    out, err = _Stream(), _Stream(tty=True)
    page = tmp_path / "map.html"
    inputs = iter(
        [
            "Who repaired the bicycle?",  # stopped while the document is read
            "Who painted the garden fence?",  # reads again, stopped while answering
            "Who sold the kettle?",  # stopped before the session began the turn
            "/bogus",
            "",
            "Who repaired the bicycle?",  # a follow-up, answered in full
            "/summarize",  # a follow-up too
            f"/kept {page}",
            "/help",
        ]
    )

    def read_line(prompt: str) -> str:
        line = next(inputs, None)
        if line is None:
            raise EOFError
        if line.startswith("Who painted"):
            out.press = lambda text: text != "It was"  # the first token, after the prefix
        if line.startswith("Who sold"):
            out.press = lambda text: text == "It was"
        return line

    before = signal.getsignal(signal.SIGINT)
    err.press = lambda text: "reading" in text
    with Session(engine.model, make_policy("snapkv"), config) as session:
        chat = Chat(session, prose(20, seed=8), max_tokens=12, answer_prefix="It was")
        assert interactive(chat, read_line, out, err) == 0
    assert signal.getsignal(signal.SIGINT) is before
    first, second, early, third, summary = chat.history
    assert first.reason == "cancelled" and first.reads_document
    assert second.reason == "cancelled" and second.reads_document, "read again after a stop"
    assert early.reason == "cancelled" and not early.reads_document and not early.text
    assert third.reason != "cancelled" and not third.reads_document
    assert third.answer.startswith("It was") and third.text.strip()
    assert summary.kind == "summarize" and summary.question == SUMMARY_INSTRUCTION
    assert not summary.reads_document and summary.reason != "cancelled"
    text = out.getvalue()
    assert text.count("[stopped]") == 3 and "/summarize" in text  # and the help
    assert third.text.strip() in text
    log = err.getvalue()
    assert "read again" in log and "unknown command /bogus" in log
    assert log.count("llama.cpp default") == 4 and f"wrote {page.resolve()}" in log
    assert "\x1b[2m" in log, "the status line is dim on a terminal"
    assert SUMMARY_INSTRUCTION in page.read_text(), "the page shows the last turn"


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pty")
@pytest.mark.slow
def test_terminal_session_in_a_pty(short_doc, tmp_path):
    """The real prompt: readline, a streamed answer, Ctrl+D quits, history saved."""
    import pty

    history = tmp_path / "history"
    master, slave = pty.openpty()
    env = {**os.environ, "KVTRIM_CHAT_HISTORY": str(history)}
    argv = [sys.executable, "-m", "engine.cli", "chat", str(short_doc), *FAST]
    proc = subprocess.Popen(
        [*argv, "--max-tokens", "6"], stdin=slave, stdout=slave, stderr=slave, env=env
    )
    os.close(slave)
    seen = b""

    def wait_for(pattern: bytes, start: int) -> int:
        nonlocal seen
        deadline = time.monotonic() + 60
        while seen.find(pattern, start) < 0 and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        at = seen.find(pattern, start)
        assert at >= 0, seen.decode(errors="replace")
        return at + len(pattern)

    try:
        at = wait_for(b"> ", wait_for(b"/help for commands", 0))
        os.write(master, b"Who sold the bicycle?\r")
        at = wait_for(b"> ", wait_for(b"llama.cpp default", at))
        os.write(master, b"\x04")  # Ctrl+D
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        os.close(master)
    assert "Who sold the bicycle?" in history.read_text()


def _one_line_error(argv: list[str], message: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert main(["chat", *argv], out=out, err=err) == 2
    assert err.getvalue().startswith("kvtrim: error:") and err.getvalue().count("\n") == 1
    assert message in err.getvalue() and not out.getvalue()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "not found"),
        ("empty", "empty"),
        ("script", "script not found"),
        ("model", "not a GGUF"),
        ("budget", "too small"),
    ],
)
def test_errors_are_one_line(tmp_path, short_doc, case, message):
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    model = tmp_path / "model.gguf"
    model.write_text("not a model")
    argv = {
        "missing": [str(tmp_path / "nope.txt")],
        "empty": [str(empty)],
        "script": [str(short_doc), "--script", str(tmp_path / "nope.jsonl")],
        "model": [str(short_doc), "--model", str(model)],
        "budget": [str(short_doc), "--budget", "20"],
    }[case]
    _one_line_error(argv, message)


@pytest.mark.parametrize("kind", ["fifo", "device", "directory"])
def test_a_script_that_is_no_file_is_refused_not_read(tmp_path, short_doc, kind):
    """A named pipe would block the open forever and /dev/zero would fill memory:
    scripts are read as documents are, regular files only."""
    path = {"fifo": tmp_path / "turns.jsonl", "device": "/dev/zero", "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    message = "a directory, not a script" if kind == "directory" else "not a regular file"
    _one_line_error([str(short_doc), "--script", str(path)], message)


@pytest.mark.slow
def test_input_that_is_not_utf8_comes_out_as_replacement_characters(tmp_path):
    """Issue 23 WEAK: invalid UTF-8 on kvtrim chat's stdin was written back raw into
    its JSON output; now it is U+FFFD there (a subprocess: real stdin decoding)."""
    doc = tmp_path / "d.txt"
    doc.write_text("The pass key is 4242.")
    script = b'{"question": "What is the key?\xff\xfe"}\nplain \xc0 question?\n'
    argv = [sys.executable, "-m", "app.main", "chat", str(doc), "--json"]
    argv += ["--max-tokens", "2", "--policy", "full"]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(argv, input=script, capture_output=True, timeout=120, cwd=root)
    out = proc.stdout.decode("utf-8")  # strict: no raw byte came back
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows[0]["question"] == "What is the key?\ufffd\ufffd"
    assert "\ufffd" in rows[1]["error"] or "\ufffd" in out


@pytest.mark.slow
def test_a_second_run_resumes_the_conversation_from_its_saved_cache(tmp_path, monkeypatch):
    """Issue 22: ``kvtrim chat FILE --script`` twice on the same file and settings: the
    second run's lines say ``resumed: true`` and its first turn reads nothing; other
    settings (or --new) do not resume, and say why."""
    monkeypatch.setenv("KVTRIM_STATES", str(tmp_path / "states"))
    doc = tmp_path / "doc.txt"
    doc.write_text(prose(60, seed=5) + " The pass key is 51723. " + prose(60, seed=6))
    first = ['{"question": "What is the pass key?", "answer_prefix": "The pass key is"}']
    code, rows, err = _chat([str(doc), *FAST, "--max-tokens", "8"], "\n".join(first))
    assert code == 0, err
    assert rows[0]["resumed"] is False and rows[0]["reads_document"]
    assert "resume_note" not in rows[0]  # nothing was saved before: nothing to say
    second = ['{"question": "Who repaired the bicycle?"}']
    code, rows, err = _chat([str(doc), *FAST, "--max-tokens", "8"], "\n".join(second))
    assert code == 0, err
    assert rows[0]["resumed"] is True and not rows[0]["reads_document"]
    assert rows[0]["turn"] == 2  # it continues the saved conversation's numbering
    code, rows, err = _chat([str(doc), *FAST, "--max-tokens", "8", "--policy", "h2o"], second[0])
    assert rows[0]["resumed"] is False and "another policy" in rows[0]["resume_note"]
    assert rows[0]["reads_document"]
    code, rows, err = _chat([str(doc), *FAST, "--max-tokens", "8", "--new"], second[0])
    assert rows[0]["resumed"] is False and rows[0]["reads_document"]
