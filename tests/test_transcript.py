"""Issue 22, finding 1: a message is shown as written. ``app.transcript`` cuts it into
blocks (a bare "48213." is text, a list needs two items the model wrote) for the chat
view's HTML and the export's Markdown; the export, read back by Qt's Markdown reader,
shows every answer as it was written."""

from __future__ import annotations

from PySide6.QtGui import QTextDocument

from app.store import Store

# (the answer, what a reader sees of it, line by line)
SHAPES = {
    "bare number": ("48213.", ["48213."]),
    "short number": ("27.", ["27."]),
    "number then text": ("27. That is all.", ["27. That is all."]),
    "paren number": ("3) three", ["3) three"]),
    "heading-like": ("# 5", ["5"]),
    "quote-like": ("> not a quote", ["> not a quote"]),
    "setext-like": ("Answer\n===", ["Answer", "==="]),
    "rule-like": ("Result\n---", ["Result", "---"]),
    "html": ("<b>bold?</b> <script>alert(1)</script>", ["<b>bold?</b> <script>alert(1)</script>"]),
    "math": ("2*3*4 = 24", ["2*3*4 = 24"]),
}


def _blocks(doc: QTextDocument) -> list:
    out, block = [], doc.begin()
    while block.isValid():
        out.append(block)
        block = block.next()
    return out


def _lines(doc: QTextDocument) -> list[str]:
    """The document's lines as a reader sees them (a <br> stays inside its block)."""
    return [line for b in _blocks(doc) for line in b.text().split("\u2028")]


def _chat_with(store: Store, answers: list[str]) -> int:
    c = store.new_conversation("Shapes")
    for i, answer in enumerate(answers):
        store.add_message(c.id, "user", f"question {i}?")
        store.add_message(c.id, "assistant", answer, "1.0 tok/s · end of answer")
    return c.id


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
