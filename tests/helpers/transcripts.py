"""Answers of every shape and how a reader sees them: a chat stored with given
answers, and a ``QTextDocument``'s blocks and lines (the chat view, the export)."""

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


def text_blocks(doc: QTextDocument) -> list:
    out, block = [], doc.begin()
    while block.isValid():
        out.append(block)
        block = block.next()
    return out


def reader_lines(doc: QTextDocument) -> list[str]:
    """The document's lines as a reader sees them (a <br> stays inside its block)."""
    return [line for b in text_blocks(doc) for line in b.text().split("\u2028")]


def chat_with(store: Store, answers: list[str]) -> int:
    c = store.new_conversation("Shapes")
    for i, answer in enumerate(answers):
        store.add_message(c.id, "user", f"question {i}?")
        store.add_message(c.id, "assistant", answer, "1.0 tok/s · end of answer")
    return c.id
