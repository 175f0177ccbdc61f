"""Issue 22, finding 1: a message is shown as written. ``app.transcript`` cuts it into
blocks (a bare "48213." is text, a list needs two items the model wrote) for the chat
view's HTML and the export's Markdown; the export, read back by Qt's Markdown reader,
shows every answer as it was written."""

from __future__ import annotations

from helpers.transcripts import SHAPES
from helpers.transcripts import chat_with as _chat_with
from helpers.transcripts import reader_lines as _lines
from helpers.transcripts import text_blocks as _blocks
from PySide6.QtGui import QTextDocument

from app.store import Store


def test_the_export_renders_every_answer_as_written(qapp, tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    answers = [SHAPES[name][0] for name in SHAPES] + ["1. apples\n2. pears"]
    cid = _chat_with(store, answers)
    markdown = store.export_markdown(cid)
    assert "\n48213\\.\n" in markdown and "\n1. apples\n2. pears\n" in markdown
    doc = QTextDocument()
    doc.setMarkdown(markdown)
    texts = _lines(doc)
    for answer, shown in SHAPES.values():
        at = texts.index(shown[0])
        assert texts[at : at + len(shown)] == shown, answer
        assert texts[at - 1] == "kvtrim:"
    listed = [b for b in _blocks(doc) if b.textList()]
    assert [b.text() for b in listed] == ["apples", "pears"]  # the model's own list


def test_blocks_tell_a_written_list_from_a_bare_number():
    from app.transcript import blocks, to_markdown

    assert [b.kind for b in blocks("48213.")] == ["text"]
    assert [b.kind for b in blocks("27. That is all.")] == ["text"]
    assert [b.kind for b in blocks("1. a\n2. b")] == ["list"]
    assert [b.kind for b in blocks("Intro:\n1. a\n2. b\nEnd.")] == ["text", "list", "text"]
    assert [b.kind for b in blocks("```\nunclosed, still streaming")] == ["code"]
    assert to_markdown("```\na ``` b\n```") == "````\na ``` b\n````"
