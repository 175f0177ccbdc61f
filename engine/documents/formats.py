"""Text out of HTML, PDF and DOCX files; every failure becomes a DocumentError.

Work is linear in the input: whitespace is squeezed in one pass, a PDF's text
stops at ``MAX_TEXT_CHARACTERS`` and a .docx is measured before it is parsed.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from html.parser import HTMLParser
from typing import TYPE_CHECKING

from ..errors import DocumentError
from . import limits
from .limits import size_text
from .pdf_clean import clean_pdf_text

if TYPE_CHECKING:
    from pypdf import PageObject, PdfReader

_READ_BYTES = 2**20


def _why(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:120] if lines else type(exc).__name__


_BLOCK = {
    "p",
    "div",
    "br",
    "li",
    "tr",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "section",
    "article",
    "header",
    "footer",
    "pre",
    "blockquote",
    "table",
    "ul",
    "ol",
    "dt",
    "dd",
}
_SKIP = {"script", "style", "noscript", "template", "head"}


class _Visible(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self._skip += 1
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


_WHITESPACE_RUN = re.compile(r"\s+")  # maximal runs: one match each, no backtracking


def _squeezed(run: re.Match[str]) -> str:
    breaks = run.group().count("\n")
    return "\n\n" if breaks > 1 else "\n" if breaks else " "


def squeeze_whitespace(text: str) -> str:
    """Each run of whitespace (Unicode's, non-breaking spaces too) becomes one
    space, one line break, or one blank line where it held two or more breaks;
    linear in characters."""
    return _WHITESPACE_RUN.sub(_squeezed, text).strip()


def html_text(markup: str) -> str:
    """The visible text of an HTML page, one block per paragraph."""
    parser = _Visible()
    parser.feed(markup)
    parser.close()
    return squeeze_whitespace("".join(parser.parts))


def _check_page(page: PageObject, number: int, name: str) -> None:
    """Refuse a page whose content inflates past ``MAX_PDF_PAGE_BYTES`` before
    pypdf extracts its text (in time quadratic in it)."""
    contents = page.get_contents()
    size = len(contents.get_data()) if contents is not None else 0
    if size > limits.MAX_PDF_PAGE_BYTES:
        raise DocumentError(
            f"{name}: page {number}'s content is {size_text(size)}, over kvtrim's limit of "
            f"{size_text(limits.MAX_PDF_PAGE_BYTES)} per PDF page"
        )


def _page_texts(reader: PdfReader, name: str) -> list[str]:
    """Each page's text, stopping with a DocumentError past ``MAX_TEXT_CHARACTERS``."""
    pages: list[str] = []
    total = 0
    for number, page in enumerate(reader.pages, start=1):
        _check_page(page, number, name)
        text = (page.extract_text() or "").strip()
        total += len(text)
        if total > limits.MAX_TEXT_CHARACTERS:
            raise DocumentError(limits.too_much_text(name))
        pages.append(text)
    return pages


def pdf_text(data: bytes, name: str) -> str:
    """The text layer of a PDF, pages separated by blank lines, cleaned to read
    like text (``pdf_clean``: ligatures folded, tabs and space runs squeezed)."""
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                ok = reader.decrypt("")
            except Exception:
                ok = 0
            if not ok:
                raise DocumentError(f"{name} is an encrypted PDF; decrypt it first")
        pages = _page_texts(reader, name)
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DocumentError(f"{name} is not a readable PDF ({_why(exc)})") from None
    except LimitReachedError:
        raise DocumentError(
            f"{name} has a stream that inflates past pypdf's size limit; is it a PDF bomb?"
        ) from None
    except Exception as exc:  # pypdf raises many types on corrupt input
        raise DocumentError(f"{name} is not a readable PDF ({type(exc).__name__})") from None
    return clean_pdf_text("\n\n".join(p for p in pages if p))


def _unpacked_bytes(archive: zipfile.ZipFile, name: str) -> int:
    """What the zip's parts unpack to, in bytes: first by their headers, then by
    inflating them in 1 MiB reads (headers can lie), stopping past ``MAX_UNPACKED_BYTES``."""
    infos = archive.infolist()
    total = sum(info.file_size for info in infos)
    if total > limits.MAX_UNPACKED_BYTES:
        raise DocumentError(_bomb(name, total))
    total = 0
    for info in infos:
        with archive.open(info) as part:
            while chunk := part.read(_READ_BYTES):
                total += len(chunk)
                if total > limits.MAX_UNPACKED_BYTES:
                    raise DocumentError(_bomb(name, total))
    return total


def _bomb(name: str, size_bytes: int) -> str:
    return (
        f"{name} unpacks to more than kvtrim's limit of {size_text(limits.MAX_UNPACKED_BYTES)} "
        f"({size_text(size_bytes)} or more); is it a zip bomb?"
    )


def _no_doctype(archive: zipfile.ZipFile, name: str) -> None:
    """Word never writes a DOCTYPE; one declares entities, which the XML parser
    drops with the text after them (an XXE payload read as a shorter document)."""
    for info in archive.infolist():
        if info.filename.endswith(".xml") and info.file_size:
            with archive.open(info) as part:
                head = part.read(4096)
            if b"<!DOCTYPE" in head or b"<!ENTITY" in head:
                raise DocumentError(
                    f"{name} declares XML entities ({info.filename} has a DOCTYPE), which "
                    "Word never writes; kvtrim does not read it"
                )


def docx_text(data: bytes, name: str) -> str:
    """Paragraphs and table cells of a Word document, in document order; a document
    that unpacks to more than ``MAX_UNPACKED_BYTES`` is refused before it is parsed."""
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            _unpacked_bytes(archive, name)
            _no_doctype(archive, name)
        document = docx.Document(io.BytesIO(data))
    except DocumentError:
        raise
    except (
        PackageNotFoundError,
        zipfile.BadZipFile,
        zlib.error,
        EOFError,
        NotImplementedError,
        KeyError,
        ValueError,
    ) as exc:
        raise DocumentError(f"{name} is not a readable .docx file ({_why(exc)})") from None
    except Exception as exc:
        raise DocumentError(f"{name} is not a readable .docx file ({type(exc).__name__})") from None
    parts = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            parts.append("\t".join(cell.text for cell in row.cells))
    return "\n".join(p for p in parts if p.strip())
