"""Messages shown as written: HTML for the chat view, Markdown for the export.

A message is cut into blocks: code fences, pipe tables, lists, headings and text.
A list is two or more items the model wrote (``1. apples`` then ``2. pears``); a
bare answer such as ``48213.`` or ``27. That is all.`` is text, never a list
marker. HTML-looking text (``<b>``, ``<script>``) is shown literally. The chat view
gets HTML built here (Qt's Markdown reader would turn ``48213.`` into a list
starting at 48213, drawn in the margin); the export gets Markdown with every
construct a bare answer would trigger escaped. No Qt: the store uses it too.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)")
_ITEM = re.compile(r"^(\s*)(\d{1,9}[.)]|[-*+•])\s+(\S.*)$")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(\S.*?)\s*#*\s*$")
_RULE_CELL = re.compile(r"^\s*:?-+:?\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![\w*])")
_EMPHASIS = re.compile(f"{_BOLD.pattern}|{_ITALIC.pattern}")


@dataclass(frozen=True)
class Block:
    """``kind``: code, table, list, heading or text; ``lines`` as written
    (a code block's without its fences); ``info``: a code fence's language."""

    kind: str
    lines: tuple[str, ...]
    info: str = ""


def blocks(text: str) -> list[Block]:
    """The message cut into blocks; blank lines separate text paragraphs."""
    lines = text.replace("\r\n", "\n").split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if not line.strip():
            i += 1
        elif fence:
            i = _code(lines, i, fence, out)
        elif _is_table(lines, i):
            end = i + 2
            while end < len(lines) and "|" in lines[end] and lines[end].strip():
                end += 1
            out.append(Block("table", tuple(lines[i:end])))
            i = end
        elif _HEADING.match(line):
            out.append(Block("heading", (line,)))
            i += 1
        elif (end := _list_end(lines, i)) > i:
            out.append(Block("list", tuple(lines[i:end])))
            i = end
        else:
            i = _paragraph(lines, i, out)
    return out


def _code(lines: list[str], i: int, fence: re.Match[str], out: list[Block]) -> int:
    """A fenced block from line ``i`` to its closing fence (or the end: still streaming)."""
    mark = fence.group(1)
    end = i + 1
    while end < len(lines) and not lines[end].strip().startswith(mark):
        end += 1
    out.append(Block("code", tuple(lines[i + 1 : end]), fence.group(2)))
    return end + 1


def _is_table(lines: list[str], i: int) -> bool:
    """A header row with pipes followed by a ``---|---`` rule."""
    if i + 1 >= len(lines) or "|" not in lines[i]:
        return False
    cells = _cells(lines[i + 1])
    return len(cells) >= 1 and "|" in lines[i + 1] and all(_RULE_CELL.match(c) for c in cells)


def _cells(row: str) -> list[str]:
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") else row
    return [cell.strip() for cell in row.split("|")]


def _list_end(lines: list[str], i: int) -> int:
    """Where a list that starts at line ``i`` ends; ``i`` when it is not a list (fewer
    than two items). Indented lines continue an item; blank lines may part items."""
    items, end, j = 0, i, i
    while j < len(lines):
        line = lines[j]
        if _ITEM.match(line):
            items += 1
            end = j = j + 1
        elif line.strip() and items and line[:1].isspace():
            end = j = j + 1  # an item's continuation
        elif not line.strip() and j + 1 < len(lines) and _ITEM.match(lines[j + 1]):
            j += 1
        else:
            break
    return end if items >= 2 else i


def _paragraph(lines: list[str], i: int, out: list[Block]) -> int:
    """Text lines up to a blank line or the start of another block."""
    end = i + 1
    while end < len(lines):
        line = lines[end]
        starts_block = (
            not line.strip()
            or _FENCE.match(line)
            or _HEADING.match(line)
            or _is_table(lines, end)
            or _list_end(lines, end) > end
        )
        if starts_block:
            break
        end += 1
    out.append(Block("text", tuple(lines[i:end])))
    return end


# -- HTML for the chat view ---------------------------------------------------


def inline_html(text: str) -> str:
    """Escaped text with the model's `code`, **bold** and *italic*."""
    parts = []
    last = 0
    for m in _CODE_SPAN.finditer(text):
        parts.append(_emphasis(html.escape(text[last : m.start()], quote=False)))
        parts.append(f"<code>{html.escape(m.group(2), quote=False)}</code>")
        last = m.end()
    parts.append(_emphasis(html.escape(text[last:], quote=False)))
    return "".join(parts)


def _emphasis(escaped: str) -> str:
    return _ITALIC.sub(r"<i>\1</i>", _BOLD.sub(r"<b>\1</b>", escaped))


def to_html(text: str) -> str:
    """One message as HTML for a ``QTextDocument``: every block, text as written."""
    out = []
    for block in blocks(text):
        if block.kind == "code":
            code = html.escape("\n".join(block.lines), quote=False)
            out.append(f"<pre>{code}</pre>")
        elif block.kind == "table":
            out.append(_table_html(block.lines))
        elif block.kind == "heading":
            m = _HEADING.match(block.lines[0])
            assert m is not None
            out.append(f"<p><b>{inline_html(m.group(2))}</b></p>")
        elif block.kind == "list":
            out.extend(_list_html(block.lines))
        else:
            body = "<br>".join(inline_html(line.strip()) for line in block.lines)
            out.append(f"<p>{body}</p>")
    return "\n".join(out)


def _list_html(lines: tuple[str, ...]) -> list[str]:
    """Each item a paragraph with the model's own marker (bullets as •), indented
    by its nesting, wrapped lines hanging under the text."""
    out: list[str] = []
    for line in lines:
        m = _ITEM.match(line)
        if m is None:  # a continuation of the item above
            if out:
                out[-1] = out[-1][: -len("</p>")] + f"<br>{inline_html(line.strip())}</p>"
            continue
        depth = len(m.group(1).expandtabs(4)) // 2
        marker = "•" if m.group(2) in "-*+•" else m.group(2)
        margin = 26 + 18 * depth
        out.append(
            f'<p style="margin-left:{margin}px; text-indent:-14px; margin-top:0px; '
            f'margin-bottom:2px">{html.escape(marker)} {inline_html(m.group(3))}</p>'
        )
    return out


def _table_html(lines: tuple[str, ...]) -> str:
    header, rows = _cells(lines[0]), [_cells(row) for row in lines[2:]]
    head = "".join(f"<th>{inline_html(c)}</th>" for c in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{inline_html(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return (
        '<table border="1" cellspacing="0" cellpadding="4" style="border-collapse:collapse">'
        f"<tr>{head}</tr>{body}</table>"
    )


# -- Markdown for the export --------------------------------------------------

_MD_NUMBER = re.compile(r"^(\s*\d{1,9})([.)])(?=\s|$)")
_MD_MARK = re.compile(r"^(\s*)(>|[-+](?=\s|$)|#{1,6}(?=\s|$))")
_MD_UNDERLINE = re.compile(r"^\s*([=\-*_])[\s=\-*_]*$")
_MD_ENTITY = re.compile(r"&(?=#?\w+;)")


def to_markdown(text: str) -> str:
    """The message as Markdown that renders as written: code, tables, lists and
    headings the model wrote stay (with its `code`, **bold** and *italic*); in text,
    a leading ``48213.``, ``#``, ``>`` or ``-``, a ``===``/``---`` line, other
    asterisks and HTML-looking text are escaped, and line breaks are kept."""
    out: list[str] = []
    for block in blocks(text):
        if block.kind == "code":
            longest = max((len(r) for r in re.findall(r"`+", "\n".join(block.lines))), default=0)
            fence = "`" * max(3, longest + 1)
            out.append("\n".join((f"{fence}{block.info}", *block.lines, fence)))
        elif block.kind == "text":
            lines = [escape_markdown_line(line.strip()) for line in block.lines]
            out.append("\\\n".join(lines))  # a backslash ends a line: a hard break
        elif block.kind == "list":
            out.append("\n".join(_list_item_markdown(line) for line in block.lines))
        elif block.kind == "heading":
            m = _HEADING.match(block.lines[0])
            assert m is not None
            out.append(f"{m.group(1)} {_inline_markdown(m.group(2))}")
        else:  # a table: its separators as written, its cells' text escaped
            out.append("\n".join(_inline_markdown(line) for line in block.lines))
    return "\n\n".join(out)


def escape_markdown_line(line: str) -> str:
    """One line of text that Markdown shows as written."""
    line = _inline_markdown(line)
    if _MD_UNDERLINE.match(line):
        stripped = line.lstrip()
        return line[: len(line) - len(stripped)] + "\\" + stripped
    if m := _MD_NUMBER.match(line):  # 48213. -> 48213\.
        return f"{m.group(1)}\\{m.group(2)}{line[m.end() :]}"
    if m := _MD_MARK.match(line):  # # > - + at the start (* is escaped already)
        return f"{m.group(1)}\\{line[m.end(1) :]}"
    return line


def _list_item_markdown(line: str) -> str:
    m = _ITEM.match(line)
    if m is None:  # a continuation line
        return _inline_markdown(line)
    marker = "-" if m.group(2) == "•" else m.group(2)
    return f"{m.group(1)}{marker} {_inline_markdown(m.group(3))}"


def _inline_markdown(text: str) -> str:
    """Code spans as written; elsewhere backslashes, ``<``, entities and the asterisks
    that are not the model's **bold** or *italic* escaped."""
    parts, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        parts += [_plain_markdown(text[last : m.start()]), m.group(0)]
        last = m.end()
    parts.append(_plain_markdown(text[last:]))
    return "".join(parts)


def _plain_markdown(text: str) -> str:
    text = _MD_ENTITY.sub(r"\\&", text.replace("\\", "\\\\").replace("<", "\\<"))
    parts, last = [], 0
    for m in _EMPHASIS.finditer(text):
        parts += [text[last : m.start()].replace("*", "\\*"), m.group(0)]
        last = m.end()
    parts.append(text[last:].replace("*", "\\*"))
    return "".join(parts)
