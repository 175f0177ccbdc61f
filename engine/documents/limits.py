"""How much kvtrim reads of one document, and the messages that name each limit
(see ``load`` for why each is what it is). Units: bytes and characters."""

from __future__ import annotations

_MIB = 2**20
MAX_DOCUMENT_BYTES = 128 * _MIB
MAX_TEXT_CHARACTERS = 32 * _MIB
MAX_UNPACKED_BYTES = 256 * _MIB
MAX_PDF_PAGE_BYTES = 4 * _MIB


def size_text(n_bytes: int) -> str:
    """``128 MiB`` or ``1,000 bytes``: a size as a message names it."""
    return f"{n_bytes / _MIB:,.0f} MiB" if n_bytes >= _MIB else f"{n_bytes:,} bytes"


def too_much_text(name: str) -> str:
    """The message for a document past ``MAX_TEXT_CHARACTERS``."""
    return (
        f"{name} holds more than kvtrim's limit of {MAX_TEXT_CHARACTERS:,} characters "
        "for a document; split it"
    )
