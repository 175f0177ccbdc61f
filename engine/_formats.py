"""Text out of HTML, PDF and DOCX files; every failure becomes a DocumentError."""

from __future__ import annotations

import io
import re
import zipfile
from html.parser import HTMLParser

from .errors import DocumentError


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


def html_text(markup: str) -> str:
    """The visible text of an HTML page, one block per paragraph."""
    parser = _Visible()
    parser.feed(markup)
    parser.close()
    text = "".join(parser.parts)
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    return re.sub(r"\s*\n\s*(\n\s*)*", lambda m: "\n\n" if m.group(1) else "\n", text).strip()


def pdf_text(data: bytes, name: str) -> str:
    """The text layer of a PDF, pages separated by blank lines."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                ok = reader.decrypt("")
            except Exception:
                ok = 0
            if not ok:
                raise DocumentError(f"{name} is an encrypted PDF; decrypt it first")
        pages = [page.extract_text() or "" for page in reader.pages]
    except DocumentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DocumentError(f"{name} is not a readable PDF ({_why(exc)})") from None
    except Exception as exc:  # pypdf raises many types on corrupt input
        raise DocumentError(f"{name} is not a readable PDF ({type(exc).__name__})") from None
    return "\n\n".join(p.strip() for p in pages if p.strip())


def docx_text(data: bytes, name: str) -> str:
    """Paragraphs and table cells of a Word document, in document order."""
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise DocumentError(f"{name} is not a readable .docx file ({_why(exc)})") from None
    except Exception as exc:
        raise DocumentError(f"{name} is not a readable .docx file ({type(exc).__name__})") from None
    parts = [p.text for p in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            parts.append("\t".join(cell.text for cell in row.cells))
    return "\n".join(p for p in parts if p.strip())
