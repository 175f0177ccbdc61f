"""Reading documents as text, with clear errors for what cannot be read.

Text files (``.txt``, ``.md`` and any other plain text) are decoded as UTF-8
when they are, else with the encoding charset-normalizer detects; binary data
is refused rather than fed to the model as noise.
"""

from __future__ import annotations

from pathlib import Path

from charset_normalizer import from_bytes

from .errors import DocumentError

_SNIFF_BYTES = 8192
_MAX_CONTROL_RATIO = 0.05


def _looks_binary(data: bytes) -> bool:
    head = data[:_SNIFF_BYTES]
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 with a BOM
        return False
    return b"\x00" in head


def _control_ratio(text: str) -> float:
    sample = text[:_SNIFF_BYTES]
    bad = sum(1 for ch in sample if ord(ch) < 32 and ch not in "\n\r\t\f")
    return bad / max(len(sample), 1)


_WESTERN = ("cp1252", "latin_1", "iso8859_15")


def _detected(data: bytes, name: str) -> str:
    """Decode with charset-normalizer's least chaotic guess; among equally clean
    guesses prefer Western European, the commonest legacy encoding of documents."""
    matches = list(from_bytes(data))
    if not matches:
        raise DocumentError(f"cannot detect the text encoding of {name}")
    best = matches[0]
    for m in matches:
        if m.encoding in _WESTERN and m.chaos <= best.chaos + 0.01:
            return str(m)
    return str(best)


def decode_text(data: bytes, name: str = "input") -> str:
    """Bytes to text: UTF-8 first, then the detected encoding; refuse binary."""
    if not data.strip():
        raise DocumentError(f"{name} is empty")
    if _looks_binary(data):
        raise DocumentError(f"{name} looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = _detected(data, name)
    if _control_ratio(text) > _MAX_CONTROL_RATIO:
        raise DocumentError(f"{name} looks like a binary file, not text")
    if not text.strip():
        raise DocumentError(f"{name} has no text")
    return text


def load_document(path: Path | str) -> str:
    """The text of the document at ``path``."""
    p = Path(path)
    try:
        if p.is_dir():
            raise DocumentError(f"{p} is a directory, not a document")
        data = p.read_bytes()
    except FileNotFoundError:
        raise DocumentError(f"document not found: {p}") from None
    except PermissionError:
        raise DocumentError(f"permission denied reading {p}") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {p}: {exc.strerror or exc}") from None
    return decode_text(data, p.name)
