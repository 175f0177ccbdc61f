"""The documents attached to a chat: read once, sent with each request."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TITLE_CHARS = 80  # a chat's title: the start of its first message


@dataclass(frozen=True)
class Attached:
    """A document of the chat: its text, and where it was read from."""

    name: str
    text: str
    path: Path


def joined(documents: Sequence[Attached]) -> str:
    """What the model reads: one document as it is, several under their names."""
    if len(documents) == 1:
        return documents[0].text
    return "\n\n".join(f"# {d.name}\n\n{d.text}" for d in documents)


def title_for(text: str) -> str:
    """A chat's title from its first message: the words of its first line."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    words = " ".join(line.split())
    return words if len(words) <= TITLE_CHARS else words[: TITLE_CHARS - 1].rstrip() + "…"
