"""Reading documents as text, with clear errors for what cannot be read.

Supported: ``.txt``/``.md`` and other plain text (UTF-8; UTF-16 and UTF-32 with or
without a byte-order mark; else the encoding charset-normalizer detects),
``.html``/``.htm`` (visible text, via the standard library's HTML parser), ``.pdf``
(pypdf's text layer) and ``.docx`` (python-docx: paragraphs and tables). Binary
data, PDFs without a text layer, encrypted PDFs and corrupt files are refused with
a one-line reason.

Limits, each refused with a one-line reason that names it:

* only regular files are read: devices (``/dev/zero``), named pipes and sockets
  are refused before they are opened;
* ``MAX_DOCUMENT_BYTES`` (128 MiB): the largest file read;
* ``MAX_TEXT_CHARACTERS`` (32 Mi characters, some 8 million tokens): the most
  text one document may give, whatever its format;
* ``MAX_UNPACKED_BYTES`` (256 MiB): the most a ``.docx`` may unpack to (a zip
  bomb is refused before it is parsed);
* ``MAX_PDF_PAGE_BYTES`` (4 MiB): the most one PDF page's content stream may
  inflate to (pypdf's text extraction takes time by its square: seconds at
  4 MiB, half an hour at 60 MiB). Every stream also stays under pypdf's own
  output limits.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from pathlib import Path

from charset_normalizer import from_bytes

from ..errors import DocumentError
from . import limits
from .limits import size_text

_SNIFF_BYTES = 8192
_MAX_CONTROL_RATIO = 0.05
_MIN_NUL_SHARE = 0.05  # of UTF-16 characters: spaces alone are some 15% of prose
_VISIBLE_BYTE = re.compile(rb"[^ \t\n\r\x0b\x0c]")
_VISIBLE_CHAR = re.compile(r"\S")
_BOMS = (  # UTF-32 first: its little-endian mark starts with UTF-16's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def _bom_codec(data: bytes) -> str | None:
    return next((codec for bom, codec in _BOMS if data.startswith(bom)), None)


def _nul_parity(head: bytes) -> tuple[int, int]:
    """NUL bytes of ``head`` at (even, odd) offsets."""
    pairs = len(head) // 2
    return head[0 : 2 * pairs : 2].count(0), head[1 : 2 * pairs : 2].count(0)


def _one_sided(even: int, odd: int) -> bool:
    """(Nearly) every NUL on one side: the high bytes of UTF-16 text, not binary."""
    return max(even, odd) >= 2 and min(even, odd) * 50 <= max(even, odd)


def _utf16_codec(head: bytes) -> str | None:
    """UTF-16 without a byte-order mark, told by its NUL bytes: the high byte of
    spaces, digits, line breaks and Latin letters. When at least 5% of the
    characters of ``head`` (a few KiB) have one and (nearly) every NUL falls at odd
    offsets it is little-endian, at even offsets big-endian. Fewer (Chinese
    without spaces) are left to charset-normalizer."""
    even, odd = _nul_parity(head)
    if not _one_sided(even, odd) or max(even, odd) < len(head) // 2 * _MIN_NUL_SHARE:
        return None
    return "utf-16-le" if odd > even else "utf-16-be"


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
            best = m
            break
    return data.decode(best.encoding, errors="replace")


def _binary(name: str) -> DocumentError:
    return DocumentError(f"{name} looks like a binary file, not text")


def _sparse_utf16(data: bytes, name: str) -> str:
    """UTF-16 with few NULs (Chinese with line breaks), as charset-normalizer reads
    it; anything it does not call UTF-16 is binary."""
    best = from_bytes(data).best()
    if best is None or not best.encoding.startswith("utf_16"):
        raise _binary(name)
    try:
        return data.decode(best.encoding)
    except UnicodeDecodeError:
        raise _binary(name) from None


def _decode(data: bytes, name: str) -> str:
    head = data[:_SNIFF_BYTES]
    codec = _bom_codec(head)
    if codec is None and b"\x00" in head:
        codec = _utf16_codec(head)
        if codec is None:
            if not _one_sided(*_nul_parity(head)):
                raise _binary(name)
            return _sparse_utf16(data, name)
    try:
        return data.decode(codec or "utf-8")
    except UnicodeDecodeError:
        if codec is not None:
            raise _binary(name) from None
    return _detected(data, name)


def decode_text(data: bytes, name: str = "input") -> str:
    """Bytes to text: by a byte-order mark, UTF-16 by its NUL bytes, UTF-8, then
    the detected encoding; binary and empty input are refused."""
    if not _VISIBLE_BYTE.search(data):
        raise DocumentError(f"{name} is empty")
    text = _decode(data, name)
    if _control_ratio(text) > _MAX_CONTROL_RATIO:
        raise _binary(name)
    return _nonempty(text, name)


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


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a plain file"


def _check_regular(p: Path, mode: int, what: str = "document") -> None:
    if stat.S_ISDIR(mode):
        raise DocumentError(f"{p} is a directory, not a {what}")
    if not stat.S_ISREG(mode):
        raise DocumentError(f"{p} is not a regular file ({_kind(mode)}); kvtrim reads files only")


def _too_large(p: Path, what: str = "document") -> DocumentError:
    return DocumentError(
        f"{p} is larger than kvtrim's limit of {size_text(limits.MAX_DOCUMENT_BYTES)} for a {what}"
    )


# O_NONBLOCK: a pipe swapped in between stat and open cannot block the open
_OPEN_FLAGS = os.O_RDONLY | sum(getattr(os, f, 0) for f in ("O_NONBLOCK", "O_CLOEXEC", "O_BINARY"))


def read_regular(p: Path, what: str = "document") -> bytes:
    """At most ``MAX_DOCUMENT_BYTES`` of the regular file ``p`` (a ``what``, for the
    messages). It is checked with stat before it is opened (opening a pipe would
    block), and again once open; OS errors (not found, permission) pass through."""
    _check_regular(p, p.stat().st_mode, what)
    fd = os.open(p, _OPEN_FLAGS)
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        _check_regular(p, info.st_mode, what)  # swapped for a pipe between stat and open
        if info.st_size > limits.MAX_DOCUMENT_BYTES:
            raise _too_large(p, what)
        want = info.st_size + 1  # one byte more tells a file that grew since
        data = f.read(want)
        if len(data) == want:
            data += f.read(limits.MAX_DOCUMENT_BYTES + 1 - want)
    if len(data) > limits.MAX_DOCUMENT_BYTES:
        raise _too_large(p, what)
    return data


def _read_bytes(p: Path) -> bytes:
    try:
        return read_regular(p)
    except FileNotFoundError:
        raise DocumentError(f"document not found: {p}") from None
    except PermissionError:
        raise DocumentError(f"permission denied reading {p}") from None
    except IsADirectoryError:
        raise DocumentError(f"{p} is a directory, not a document") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {p}: {exc.strerror or exc}") from None


def load_document(path: Path | str) -> str:
    """The text of the document at ``path``, by its file type; at most
    ``MAX_TEXT_CHARACTERS`` characters."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in _BINARY_SUFFIXES:
        raise DocumentError(
            f"{p.name}: {suffix} files are not supported; use {', '.join(SUFFIXES)}"
        )
    data = _read_bytes(p)
    if suffix in (".html", ".htm"):
        from .formats import html_text

        text = _nonempty(html_text(_within_limit(decode_text(data, p.name), p.name)), p.name)
    elif suffix == ".pdf":
        from .formats import pdf_text

        text = _nonempty(pdf_text(data, p.name), p.name, "has no text layer (a scan?)")
    elif suffix == ".docx":
        from .formats import docx_text

        text = _nonempty(docx_text(data, p.name), p.name)
    else:
        text = decode_text(data, p.name)
    return _within_limit(text, p.name)


def _within_limit(text: str, name: str) -> str:
    if len(text) > limits.MAX_TEXT_CHARACTERS:
        raise DocumentError(limits.too_much_text(name))
    return text


def _nonempty(text: str, name: str, why: str = "has no text") -> str:
    if not _VISIBLE_CHAR.search(text):
        raise DocumentError(f"{name} {why}")
    return text
