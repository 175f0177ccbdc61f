"""Reading documents as text, with clear errors for what cannot be read.

Supported: ``.txt``/``.md`` and other plain text (UTF-8, else the encoding
charset-normalizer detects), ``.html``/``.htm`` (visible text, via the standard
library's HTML parser), ``.pdf`` (pypdf's text layer) and ``.docx``
(python-docx: paragraphs and tables). Binary data, PDFs without a text layer,
encrypted PDFs and corrupt files are refused with a one-line reason.
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


SUFFIXES = (".txt", ".md", ".markdown", ".rst", ".csv", ".log", ".html", ".htm", ".pdf", ".docx")
_BINARY_SUFFIXES = {
    ".doc",
    ".xls",
    ".xlsx",
    ".ppt",
    ".pptx",
    ".odt",
    ".rtf",
    ".epub",
    ".zip",
    ".png",
    ".jpg",
    ".jpeg",
    ".gif",
    ".exe",
    ".gguf",
    ".bin",
}


def _read_bytes(p: Path) -> bytes:
    try:
        if p.is_dir():
            raise DocumentError(f"{p} is a directory, not a document")
        return p.read_bytes()
    except FileNotFoundError:
        raise DocumentError(f"document not found: {p}") from None
    except PermissionError:
        raise DocumentError(f"permission denied reading {p}") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {p}: {exc.strerror or exc}") from None


def load_document(path: Path | str) -> str:
    """The text of the document at ``path``, by its file type."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in _BINARY_SUFFIXES:
        raise DocumentError(
            f"{p.name}: {suffix} files are not supported; use {', '.join(SUFFIXES)}"
        )
    data = _read_bytes(p)
    if suffix in (".html", ".htm"):
        from ._formats import html_text

        return _nonempty(html_text(decode_text(data, p.name)), p.name)
    if suffix == ".pdf":
        from ._formats import pdf_text

        return _nonempty(pdf_text(data, p.name), p.name, "has no text layer (a scan?)")
    if suffix == ".docx":
        from ._formats import docx_text

        return _nonempty(docx_text(data, p.name), p.name)
    return decode_text(data, p.name)


def _nonempty(text: str, name: str, why: str = "has no text") -> str:
    if not text.strip():
        raise DocumentError(f"{name} {why}")
    return text
