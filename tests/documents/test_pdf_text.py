"""PDF text that reads like text (issue 22, item 6): PDFs written by Qt and by
matplotlib come out without tabs, ligature characters or space runs, their lines
and words as written; the cleaning rules themselves on plain strings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.documents.load import load_document
from engine.documents.pdf_clean import LIGATURES, clean_pdf_text

PARAGRAPHS = [
    "The first finding of the office workflow is that efficient filing fits in a "
    "difficult affair: fine figures, fluffy buffers and official fields.",
    "A second paragraph defines the fifty offline files, the staff and their effort, "
    "so that the reflow across several lines of the page shows how line ends come out.",
    "The last paragraph is plain: no ligature at all in these words, only a long line "
    "that wraps and wraps again until the end of the page is near.",
]
LIGATURE_CHARACTERS = "".join(chr(code) for code in LIGATURES)


def qt_pdf(path: Path, paragraphs: list[str], title: str = "Efficient filing") -> Path:
    """A PDF written by Qt (``QTextDocument.print_`` to a ``QPdfWriter``), offscreen."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QPageSize, QPdfWriter, QTextDocument
    from PySide6.QtWidgets import QApplication

    # a QApplication, not a QGuiApplication: it outlives this test, and the app's
    # tests that run after it in the same process create widgets (Qt aborts otherwise)
    app = QApplication.instance() or QApplication([])
    assert app is not None
    writer = QPdfWriter(str(path))
    writer.setPageSize(QPageSize(QPageSize.PageSizeId.A4))
    doc = QTextDocument()
    doc.setHtml(f"<h1>{title}</h1>" + "".join(f"<p>{p}</p>" for p in paragraphs))
    doc.print_(writer)
    del writer  # the file is complete when the writer goes
    return path


def matplotlib_pdf(path: Path, lines: list[str]) -> Path:
    """A PDF written by matplotlib's PDF backend, one text line per entry (a
    ``Figure`` of its own: pyplot's global backend is left as it is)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 11))
    for i, line in enumerate(lines):
        fig.text(0.05, 0.95 - i * 0.03, line)
    fig.savefig(path, format="pdf")
    return path


def _words(text: str) -> list[str]:
    return text.split()


def test_qt_pdf_reads_like_text(tmp_path):
    text = load_document(qt_pdf(tmp_path / "qt.pdf", PARAGRAPHS))
    assert "\t" not in text and "  " not in text
    assert not set(LIGATURE_CHARACTERS) & set(text), "ligatures unfolded"
    assert "first finding of the office workflow" in text
    assert "efficient filing fits in a" in text
    want = _words("Efficient filing " + " ".join(PARAGRAPHS))
    assert _words(text)[: len(want)] == want, "every word, in order"
    assert text.count("\n") >= len(PARAGRAPHS) + 1, "one line per line of the page"
    assert all(line == line.strip() for line in text.splitlines())


def test_matplotlib_pdf_reads_like_text(tmp_path):
    lines = [
        "The \ufb01rst \ufb01nding of the o\ufb03ce work\ufb02ow.",
        "Name    Value    Unit",
        "speed   12       km/h",
    ]
    text = load_document(matplotlib_pdf(tmp_path / "mpl.pdf", lines))
    assert text.splitlines() == [
        "The first finding of the office workflow.",
        "Name Value Unit",
        "speed 12 km/h",
    ]


def test_ligatures_fold_and_nothing_else_does():
    assert clean_pdf_text("\ufb00 \ufb01 \ufb02 \ufb03 \ufb04 \ufb06") == "ff fi fl ffi ffl st"
    kept = "x\u00b2 \u00bd \uff21 \u2460 \u2126 caf\u00e9 \u0133"  # NFKC would change each
    assert clean_pdf_text(kept) == kept


def test_whitespace_squeezed_lines_kept():
    raw = "  a\tb  \u00a0 c \r\nd\t\n\n\n\n e\x0cf"
    assert clean_pdf_text(raw) == "a b c\nd\n\ne\nf"


@pytest.mark.parametrize(
    "raw, want",
    [
        # the document spells the joined word elsewhere: joined on the first line
        ("a docu-\nment here, one document", "a document\nhere, one document"),
        # a compound the document writes with its hyphen stays as it is
        ("fine-\ngrained, fine-grained", "fine-\ngrained, fine-grained"),
        # a word the document never spells whole stays cut
        ("a cut-\nword here", "a cut-\nword here"),
        # a capital after the hyphen: a name, not a cut word
        ("the post-\nWar document, postwar", "the post-\nWar document, postwar"),
        # a soft hyphen always joins; the line that held only the end goes
        ("docu\u00admen\u00ad\ntation\nnext", "documentation\nnext"),
        ("invisible soft\u00adhyphen", "invisible softhyphen"),
    ],
)
def test_hyphenated_line_ends(raw, want):
    assert clean_pdf_text(raw) == want


def test_pdf_tokens_match_the_text(tmp_path, engine):
    """The token count of the PDF's text is that of the text it was written from
    (a Qt PDF took 2.7 characters a token: a tab token between every two words)."""
    paragraphs = PARAGRAPHS * 4
    text = load_document(qt_pdf(tmp_path / "long.pdf", paragraphs))
    source = "Efficient filing\n" + "\n".join(paragraphs)
    tokens, source_tokens = (len(engine.model.tokenize(t)) for t in (text, source))
    assert tokens <= source_tokens * 1.05 + 4, (tokens, source_tokens)
    assert len(text) / tokens >= 4.0, "English prose: some 4-5 characters a token"
