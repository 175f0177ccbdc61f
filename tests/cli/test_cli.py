"""The kvtrim command: JSON output, and one-line errors for bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.docs_for_tests import prose

from engine.cli.main import main
from engine.native.embedded import default_model_path

KEYS = {
    "answer",
    "policy",
    "budget_tokens",
    "prompt_tokens",
    "kv_cells_peak",
    "kv_bytes_peak",
    "kv_bytes_full",
    "evicted_tokens",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "model",
}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _run_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """In a child process, so a crash of the native library cannot hide."""
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *argv], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    p = tmp_path / "notes.txt"
    p.write_text(prose(120, seed=8), encoding="utf-8")
    return p


@pytest.mark.slow
def test_ask_json_has_every_figure(notes):
    code, out, err = _run(
        "ask",
        str(notes),
        "--question",
        "Who repaired the bicycle?",
        "--policy",
        "snapkv",
        "--budget",
        "256",
        "--max-tokens",
        "8",
        "--json",
    )
    assert code == 0, err
    result = json.loads(out)
    assert set(result) >= KEYS
    assert result["policy"] == "snapkv" and result["budget_tokens"] == 256
    assert result["prompt_tokens"] > 1000
    assert result["kv_bytes_peak"] < result["kv_bytes_full"]
    assert result["evicted_tokens"] > 0
    assert result["model"] == "Gemma 3 270m"
    assert result["gpu"].startswith("no NVIDIA GPU")
    assert result["finish_reason"] in ("stop", "eog", "length", "repetition")
    assert result["summary_parts"] is None  # an answer, not a summary


@pytest.mark.slow
def test_summarize_prints_answer_and_summary_line(notes):
    code, out, err = _run(
        "summarize", str(notes), "--policy", "h2o", "--budget", "256", "--max-tokens", "12"
    )
    assert code == 0, err
    assert out.strip()
    assert err.count("\n") == 1 and "[h2o budget=256]" in err and "tok/s" in err
    assert "finished: " in err  # why it ended (issue 22)


@pytest.mark.slow
def test_info_reports_model_and_memory():
    out = io.StringIO()
    assert main(["info"], out=out) == 0
    text = out.getvalue()
    assert "global layers scored: [5, 11, 17]" in text
    assert "GPU: no NVIDIA GPU" in text


def _bad_model_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    real = default_model_path().read_bytes()
    files = {
        "missing": (tmp / "nope.gguf", "not found"),
        "empty": (tmp / "empty.gguf", "empty"),
        "text": (tmp / "text.gguf", "not a GGUF"),
        "truncated": (tmp / "trunc.gguf", "truncated"),
        "header_only": (tmp / "head.gguf", "truncated"),
        "directory": (tmp / "dir.gguf", "not a file"),
    }
    files["empty"][0].write_bytes(b"")
    files["text"][0].write_text("hello, I am not a model\n")
    files["truncated"][0].write_bytes(real[: 1 << 20])
    files["header_only"][0].write_bytes(b"GGUF\x03\x00")
    files["directory"][0].mkdir()
    return files


@pytest.mark.parametrize(
    "case", ["missing", "empty", "text", "truncated", "header_only", "directory"]
)
def test_bad_model_file_gives_one_line_error(tmp_path, notes, case):
    path, message = _bad_model_files(tmp_path)[case]
    proc = _run_process("ask", str(notes), "-q", "Who?", "--model", str(path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtrim: error:"), proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


def _bad_documents(tmp: Path) -> dict[str, tuple[Path, str]]:
    docs = {
        "missing": (tmp / "nope.txt", "not found"),
        "empty": (tmp / "empty.txt", "empty"),
        "binary": (tmp / "blob.txt", "binary"),
        "directory": (tmp / "folder", "directory"),
    }
    docs["empty"][0].write_text("  \n")
    docs["binary"][0].write_bytes(bytes(range(256)) * 20)
    docs["directory"][0].mkdir()
    return docs


@pytest.mark.parametrize("case", ["missing", "empty", "binary", "directory"])
def test_bad_document_gives_one_line_error(tmp_path, case):
    path, message = _bad_documents(tmp_path)[case]
    code, _out, err = _run("summarize", str(path))
    assert code == 2
    assert err.startswith("kvtrim: error:") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--budget", "20"], "too small"),
        (["--budget", "4"], "at least"),
        (["--chunk", "3"], "chunk"),
        pytest.param(
            ["--policy", "full", "--budget", "64"], "does not fit", marks=pytest.mark.slow
        ),
        (["--temperature", "-1"], "temperature"),
    ],
)
def test_bad_settings_give_one_line_error(notes, argv, message):
    code, _out, err = _run("ask", str(notes), "-q", "Who?", *argv)
    assert code == 2, err
    assert err.startswith("kvtrim: error:") and message in err and err.count("\n") == 1


@pytest.mark.slow
def test_batch_summarize_writes_one_file_each_and_skips_bad_ones(tmp_path):
    docs = tmp_path / "docs"
    (docs / "more").mkdir(parents=True)
    (docs / "a.txt").write_text(prose(30, seed=1))
    (docs / "more" / "b.md").write_text("# Notes\n\n" + prose(200, seed=2))
    (docs / "broken.docx").write_bytes(b"PK\x03\x04 not really a docx")
    (docs / ".hidden.txt").write_text("skip me")
    lone = tmp_path / "c.txt"
    lone.write_text(prose(20, seed=3))
    out, err = io.StringIO(), io.StringIO()
    argv = ["summarize", str(docs), str(lone), "--out", str(tmp_path / "out"), "--budget", "256"]
    code = main([*argv, "--max-tokens", "12"], out, err)
    assert code == 1, "one input was skipped"
    out_dir = tmp_path / "out"
    written = sorted(p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*"))
    assert written == ["a.txt.md", "c.txt.md", "more", "more/b.md.md"]  # paths under the folder
    b = (tmp_path / "out" / "more" / "b.md.md").read_text()
    assert b.startswith("# b.md\n") and "snapkv, budget 256" in b
    table = out.getvalue()
    assert "| broken.docx |" in table and "skipped" in table and ".hidden" not in table
    assert "skipped" in err.getvalue() and "broken.docx" in err.getvalue()
    rows = [line for line in table.splitlines() if line.startswith("| more/b.md")]
    tokens = int(rows[0].split("|")[2].replace(",", ""))
    assert tokens > 256  # read past the budget, evicting


@pytest.mark.slow
def test_batch_summarize_json(tmp_path):
    (tmp_path / "a.txt").write_text(prose(15, seed=4))
    out = io.StringIO()
    argv = ["summarize", str(tmp_path / "a.txt"), "--out", str(tmp_path / "o"), "--json"]
    assert main([*argv, "--max-tokens", "4"], out, io.StringIO()) == 0
    (row,) = json.loads(out.getvalue())
    assert row["error"] is None and row["prompt_tokens"] > 0 and 0 < row["retention"] <= 1


@pytest.mark.slow
def test_show_kept_writes_a_self_contained_page(tmp_path):
    from html.parser import HTMLParser

    from helpers.docs_for_tests import passkey_document

    doc = tmp_path / "haystack.txt"
    doc.write_text(passkey_document(60, 0.4, 48213))
    page = tmp_path / "kept.html"
    argv = ["ask", str(doc), "-q", "What is the pass key?", "--budget", "256"]
    code = main(
        [*argv, "--max-tokens", "6", "--show-kept", str(page)], io.StringIO(), io.StringIO()
    )
    assert code == 0
    html = page.read_text()

    class Parse(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []
            self.refs: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.refs += [v for k, v in attrs if k in ("src", "href") and v]

    parsed = Parse()
    parsed.feed(html)
    assert "snapkv" in html and "256-token budget" in html and "What is the pass key?" in html
    assert all(ref.startswith("#m") for ref in parsed.refs), "self-contained: only in-page links"
    assert "script" not in parsed.tags and parsed.tags.count("a") == 200
    import re

    assert '<span class="e">' in html
    assert "48213" in re.sub(r"<[^>]+>", "", html), "the text survives, spread over spans"


@pytest.mark.slow
def test_a_second_question_about_a_document_starts_from_its_saved_read(tmp_path, monkeypatch):
    """Issue 24: ``kvtrim ask`` twice about the same document and settings: the
    second restores the first's read (``cached_tokens``), reads only its question
    and answers right; ``--reread`` reads it all again."""
    monkeypatch.setenv("KVTRIM_STATES", str(tmp_path / "states"))
    doc = tmp_path / "doc.txt"
    doc.write_text(prose(80, seed=11) + " The locker code is 4417. " + prose(80, seed=12))
    base = ["ask", str(doc), "--budget", "256", "--json", "--max-tokens", "6"]

    def ask(*extra: str) -> dict:
        out, err = io.StringIO(), io.StringIO()
        assert main([*base, *extra], out, err) == 0, err.getvalue()
        return json.loads(out.getvalue())

    first = ask("-q", "Who repaired the bicycle?")
    assert first["cached_tokens"] == 0
    second = ask("-q", "What is the locker code?", "--answer-prefix", "The locker code is")
    # OpenAI's convention, as the server's usage (issue 36): every prompt token counts
    assert second["cached_tokens"] > 1024
    assert second["prompt_tokens"] - second["cached_tokens"] < 200
    # the whole prompt, as the first (its own question and recalled passages aside)
    assert abs(second["prompt_tokens"] - first["prompt_tokens"]) < 200
    assert "4417" in second["answer"]
    again = ask("-q", "What is the locker code?", "--answer-prefix", "The locker code is",
                "--reread")  # fmt: skip
    assert again["cached_tokens"] == 0 and again["prompt_tokens"] > 1024
    assert abs(again["prompt_tokens"] - first["prompt_tokens"]) < 200  # read again, recall too
