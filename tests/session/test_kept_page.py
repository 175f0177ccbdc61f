"""The memory-map page (--show-kept, /kept) is written only over an HTML file (issue 23
WEAK: `/kept existing.txt` silently overwrote a non-HTML file)."""

from __future__ import annotations

import os

import pytest

from engine.errors import OutputError
from engine.session.kept_html import write_page


def test_an_existing_file_that_is_not_html_is_left_alone(tmp_path):
    notes = tmp_path / "existing.txt"
    notes.write_text("my notes")
    with pytest.raises(OutputError, match="exists and is not an HTML page"):
        write_page(notes, "<html></html>")
    assert notes.read_text() == "my notes"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "kept.html"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not an HTML page"):
        write_page(fifo, "<html></html>")


def test_a_new_or_html_path_is_written(tmp_path):
    page = tmp_path / "kept.html"
    write_page(page, "<html>1</html>")
    write_page(page, "<html>2</html>")  # an earlier page is replaced
    assert page.read_text() == "<html>2</html>"
    with pytest.raises(OutputError, match="cannot write"):
        write_page(tmp_path / "missing" / "kept.html", "<html></html>")
