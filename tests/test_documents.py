"""Text documents: encodings are detected, binary and empty files refused."""

from __future__ import annotations

import pytest

from engine import DocumentError
from engine.documents import decode_text, load_document

TEXT = "Grüße aus Köln: the café serves crème brûlée. " * 30


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "cp1252", "latin-1"])
def test_encodings_are_detected(tmp_path, encoding):
    p = tmp_path / f"doc-{encoding}.txt"
    p.write_bytes(TEXT.encode(encoding))
    assert load_document(p).strip() == TEXT.strip()


def test_markdown_is_text(tmp_path):
    p = tmp_path / "notes.md"
    p.write_text("# Title\n\n- one\n- two\n", encoding="utf-8")
    assert load_document(p).startswith("# Title")


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "empty"),
        (b"   \n\t", "empty"),
        (b"\x00\x01\x02PK" * 100, "binary"),
        (bytes(range(1, 32)) * 50, "binary"),
    ],
)
def test_unreadable_bytes_are_refused(data, message):
    with pytest.raises(DocumentError, match=message):
        decode_text(data, "x")


def test_missing_and_directory(tmp_path):
    with pytest.raises(DocumentError, match="not found"):
        load_document(tmp_path / "missing.txt")
    with pytest.raises(DocumentError, match="directory"):
        load_document(tmp_path)
