"""Text documents: encodings are detected, binary and empty files refused."""

from __future__ import annotations

import pytest

from engine import DocumentError
from engine.documents.load import decode_text, load_document

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


def _write(tmp_path, name, data: bytes):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_html_gives_visible_text(tmp_path):
    html = (
        "<html><head><title>t</title><style>p{color:red}</style></head><body>"
        "<h1>Report</h1><p>The pass key is <b>4242</b>.</p><script>var x=1;</script>"
        "<ul><li>one</li><li>two &amp; three</li></ul></body></html>"
    )
    text = load_document(_write(tmp_path, "page.html", html.encode()))
    assert "The pass key is 4242." in text
    assert "two & three" in text and "var x" not in text and "color" not in text


def test_pdf_text_layer(tmp_path):
    from helpers.docs_for_tests import text_pdf

    p = _write(tmp_path, "doc.pdf", text_pdf(["The pass key is 4242.", "Remember it."]))
    text = load_document(p)
    assert "The pass key is 4242." in text and "Remember it." in text


def test_pdf_failures_are_one_line(tmp_path):
    from helpers.bad_inputs import pdfs

    messages = {"image-only.pdf": "no text layer", "encrypted.pdf": "encrypted"}
    for name, data in pdfs().items():
        with pytest.raises(DocumentError, match=messages.get(name, "not a readable PDF")) as info:
            load_document(_write(tmp_path, name, data))
        assert "\n" not in str(info.value)
    with pytest.raises(DocumentError, match="not a readable PDF"):
        load_document(_write(tmp_path, "fake.pdf", b"hello, not a pdf at all"))


def test_docx_paragraphs_and_tables(tmp_path):
    import docx

    d = docx.Document()
    d.add_heading("Minutes", level=1)
    d.add_paragraph("The pass key is 4242.")
    table = d.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "owner"
    table.rows[0].cells[1].text = "Clara"
    p = tmp_path / "notes.docx"
    d.save(p)
    text = load_document(p)
    assert "Minutes" in text and "The pass key is 4242." in text and "owner\tClara" in text


def test_docx_that_is_another_zip(tmp_path):
    import zipfile

    p = tmp_path / "fake.docx"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("hello.txt", "not a word document")
    with pytest.raises(DocumentError, match=r"not a readable \.docx"):
        load_document(p)
    with pytest.raises(DocumentError, match=r"not a readable \.docx"):
        load_document(_write(tmp_path, "junk.docx", b"plain bytes"))


def test_unknown_binary_type_is_named(tmp_path):
    with pytest.raises(DocumentError, match=r"\.xlsx files are not supported"):
        load_document(_write(tmp_path, "sheet.xlsx", b"PK\x03\x04"))
