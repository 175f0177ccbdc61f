"""A document cut into parts of about equal length at its seams, each part named by
the heading it falls under: the units a summary is made of (runtime/summary.py).

Cuts fall, in order of preference, before a heading, at a paragraph break, at a
line break, after a sentence, else anywhere; each within a quarter of a part's
length of where equal parts would be cut. Headings are recognised by their form
alone: Markdown's ``#`` lines, a line underlined with ``===``/``---``/``~~~``, a
line after a rule of ``===``, a numbered title ("3. Protecting Users' Rights"), a
line of capitals ("DESCRIPTION") and a short indented title after a blank line
("   Compression options", as man pages print them). Offsets in characters; linear
in the text's length (each rule is a regular expression run once).
"""

from __future__ import annotations

import itertools
import re
from bisect import bisect_right
from dataclasses import dataclass

_ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(\S[^\n]{0,120}?)[ \t#]*$", re.M)
_UNDERLINED = re.compile(r"^([^\n]*\S[^\n]*)\n {0,3}(?:={3,}|-{3,}|~{3,})[ \t]*$", re.M)
_AFTER_RULE = re.compile(r"^={10,}[ \t]*\n([^\n]*\S[^\n]*)$", re.M)
_NUMBERED = re.compile(
    r"(?:^|\n)[ \t]*\n[ \t]{0,4}((?:\d{1,3}\.)+\d{0,3}[ \t]+[A-Z][^\n]{2,80})$", re.M
)
_CAPITALS = re.compile(r"^[ \t]*([A-Z][A-Z0-9 ,&/()'-]{2,60})[ \t]*$", re.M)
_INDENTED = re.compile(r"(?:^|\n)[ \t]*\n( {1,4}[A-Z][A-Za-z0-9 ,&/'()-]{2,50})$", re.M)
_BLANK = re.compile(r"\n[ \t]*\n")
_NEWLINE = re.compile(r"\n")
_SENTENCE = re.compile(r"[.!?][\"')\]]*\s")
_TAGS = re.compile(r"\*[^*\s]+\*")  # vim's help tags: *05.1* *vimrc-intro*
_SPACES = re.compile(r"\s+")

MAX_TITLE = 80  # characters of a heading kept as a part's title
EDGE = 0.25  # a cut may move this share of a part's length from the equal cut


@dataclass(frozen=True)
class Part:
    """Characters ``[start, end)`` of the document, under heading ``title`` ("" if
    none comes before); ``number`` counts from 1."""

    number: int
    start: int
    end: int
    title: str

    def text(self, document: str) -> str:
        return document[self.start : self.end]


def headings(text: str) -> list[tuple[int, str]]:
    """``(offset where a part before the heading would start, its title)`` in order:
    the heading's line, or the rule above it."""
    found: dict[int, str] = {}
    for pattern in (_ATX, _UNDERLINED, _AFTER_RULE, _NUMBERED, _CAPITALS, _INDENTED):
        for m in pattern.finditer(text):
            at, title = m.start(1), m.group(1)
            if pattern is _AFTER_RULE:
                at = m.start()
            elif pattern is _UNDERLINED:
                at, title = _block(text, m.start(1), title)
            title = _SPACES.sub(" ", _TAGS.sub("", title)).strip(" #=*")
            if any(c.isalpha() for c in title):
                found.setdefault(_line_start(text, at), title[:MAX_TITLE])
    return sorted(found.items())


def _block(text: str, at: int, line: str) -> tuple[int, str]:
    """An underlined heading of up to three lines ("What's New in IDLE 3.11.0",
    "(since 3.10.0)", "Released on 2022-10-24"): its first line and offset."""
    blank = text.rfind("\n\n", 0, at)
    start = blank + 2 if blank >= 0 else 0
    lines = text[start:at].split("\n")
    if start < at and len(lines) <= 3 and lines[0].strip():
        return start, lines[0]
    return at, line


def _line_start(text: str, at: int) -> int:
    return text.rfind("\n", 0, at) + 1


def _best_cut(text: str, head_at: list[int], lo: int, hi: int, target: int) -> int:
    """Where a part should start in ``(lo, hi)``: the highest-ranked seam (a heading
    3, a paragraph 2, a line 1, a sentence 0), the nearest ``target`` among equals;
    ``target`` itself when there is none."""
    best: tuple[int, int] = (-1, 0)
    best_at = target
    found = [(3, at) for at in head_at[bisect_right(head_at, lo) : bisect_right(head_at, hi - 1)]]
    for rank, pattern in ((2, _BLANK), (1, _NEWLINE), (0, _SENTENCE)):
        found += [(rank, m.end()) for m in pattern.finditer(text, lo, hi)]
    for rank, at in found:
        key = (rank, -abs(at - target))
        if lo < at < hi and key > best:
            best, best_at = key, at
    return best_at


def split_parts(text: str, n_parts: int) -> list[Part]:
    """``text`` in ``n_parts`` parts (fewer for a text too short to cut), each
    starting at the best seam near an equal share (see the module's docstring)."""
    n = max(1, min(n_parts, len(text) // 2))
    heads = headings(text)
    head_at = [at for at, _ in heads]
    size = len(text) / n
    cuts = [0]
    for k in range(1, n):
        target = round(k * size)
        lo, hi = max(cuts[-1], round(target - EDGE * size)), round(target + EDGE * size)
        at = _best_cut(text, head_at, lo, min(hi, len(text)), target)
        if cuts[-1] < at < len(text):
            cuts.append(at)
    cuts.append(len(text))
    return [
        Part(i + 1, start, end, _title(heads, head_at, start, end))
        for i, (start, end) in enumerate(itertools.pairwise(cuts))
    ]


def _title(heads: list[tuple[int, str]], head_at: list[int], start: int, end: int) -> str:
    """The heading a part starts under: its first own heading when that comes in its
    first tenth, else the last heading before it, else its first heading."""
    first = bisect_right(head_at, start - 1)
    if first < len(heads) and heads[first][0] < start + (end - start) // 10:
        return heads[first][1]
    if first > 0:
        return heads[first - 1][1]
    return heads[first][1] if first < len(heads) and heads[first][0] < end else ""
