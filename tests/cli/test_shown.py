"""Names from disk and from model files are shown escaped (issue 23: FAIL 11 and the
terminal-escape WEAK item): undecodable bytes become U+FFFD and control characters
are written as \\xNN, in terminals and in the UTF-8 files a batch writes."""

from __future__ import annotations

import io
import os
from pathlib import Path

from helpers.model_stores import models_cli_args

from engine.cli import models as models_cli
from engine.errors import shown
from engine.native.finder import FoundModel
from engine.runtime import batch
from engine.stats import KVStats


def test_shown_escapes_control_characters_and_bad_bytes():
    assert shown("plain name.txt") == "plain name.txt"
    assert shown("\x1b]0;pwned\x07\x1b[2J") == "\\x1b]0;pwned\\x07\\x1b[2J"
    assert shown("a\rb\x00c\x9bd\tz") == "a\\x0db\\x00c\\x9bd\tz"
    name = os.fsdecode(b"bad\xff\xfename.txt")  # as Path.iterdir gives it
    assert shown(name) == "bad\ufffd\ufffdname.txt"
    shown(name).encode("utf-8")  # no surrogates left


def test_a_file_name_that_is_not_utf8_gets_its_summary_written(tmp_path):
    """FAIL 11: the summary's heading named the file raw, and writing it as UTF-8
    raised UnicodeEncodeError, which stopped the whole batch."""
    src = Path(os.fsdecode(bytes(tmp_path) + b"/bad\xff\xfename.txt"))
    out = tmp_path / "out.md"
    stats = KVStats(policy="snapkv", budget_tokens=64, n_ctx=128, kv_bytes_per_cell=1)
    item = batch.FileSummary(batch.Source(src, Path(src.name)), out, "A summary.", stats, 1.0)
    batch.write_atomic(out, batch._markdown(item))
    assert out.read_text(encoding="utf-8").startswith("# bad\ufffd\ufffdname.txt")
    assert "| bad\ufffd\ufffdname |" in batch.table([item])


def test_kvtrim_models_escapes_names_and_paths(monkeypatch, tmp_path):
    evil = FoundModel("\x1b[2Jllama\x07", tmp_path / "m\x1b[31m.gguf", "ollama", 10)
    monkeypatch.setattr(models_cli, "find_models", lambda roots: [evil])
    out = io.StringIO()
    assert models_cli.main(models_cli_args(json=False), out, io.StringIO()) == 0
    assert "\x1b" not in out.getvalue() and "\\x1b[2Jllama\\x07" in out.getvalue()


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_reader_that_went_away_ends_quietly(monkeypatch, tmp_path):
    """Issue 23 WEAK: `kvtrim ... | head -c 10` printed a BrokenPipeError traceback."""
    from engine.cli.main import main

    evil = FoundModel("m", tmp_path / "m.gguf", "ollama", 10)
    monkeypatch.setattr(models_cli, "find_models", lambda roots: [evil])
    err = io.StringIO()
    assert main(["models"], out=_ClosedPipe(), err=err) == 141
    assert err.getvalue() == ""
