"""A PDF's extracted text made to read like text (pypdf gives what the page drew).

Writers place words one by one: Qt's ``QPdfWriter`` moves to each word, and pypdf
writes those moves as tab characters; justified text and table columns come out as
runs of spaces; fonts draw "fi", "ffl" and their kin as one ligature glyph that
pypdf maps to U+FB01 and its kin. Each costs tokens and reads badly (a Qt PDF of
22,466 characters was 8,403 tokens).

What ``clean_pdf_text`` changes, and only that:

* the typographic ligatures U+FB00-FB06 (ff, fi, fl, ffi, ffl, long s t, st) and
  U+FB13-FB17 (Armenian) become their letters, as NFKC writes them. The rest of
  the text is not NFKC-normalized: that would also turn "x²" into "x2", "½" into
  "1 fraction-slash 2" and full-width or circled characters into others, changing what they say;
* any run of spaces, tabs or other horizontal whitespace (no-break spaces too)
  becomes one space, and lines lose their leading and trailing spaces;
* line breaks stay where pypdf put them (one per line of the page); runs of
  blank lines (a paragraph or page break) become one blank line;
* a word cut by a soft hyphen (U+00AD) at a line's end is joined; one cut by a
  hyphen ("docu-" / "ment") is joined only where the document itself spells the
  joined word elsewhere and never the hyphenated one ("fine-" / "grained" stays
  as it is). The joined word ends the first line, so lines keep their count.
  Other soft hyphens are invisible and are removed.

Linear in characters.
"""

from __future__ import annotations

import re
import unicodedata

_LIGATURE_CODES = (*range(0xFB00, 0xFB07), *range(0xFB13, 0xFB18))
LIGATURES = {code: unicodedata.normalize("NFKC", chr(code)) for code in _LIGATURE_CODES}
"""Code point -> its letters: the only characters folded as NFKC does."""

SOFT_HYPHEN = "\u00ad"
_HYPHENS = ("-", "\u2010")  # hyphen-minus, hyphen
_LINE_BREAK = re.compile(r"\r\n?|[\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_SPACE_RUN = re.compile(r"[^\S\n]+")  # horizontal whitespace: one match per run
_BLANK_RUN = re.compile(r"\n{3,}")
_WORD = re.compile(r"[^\W\d_]+")  # letters only
_HYPHENATED = re.compile(r"[^\W\d_]+[-\u2010][^\W\d_]+")


def clean_pdf_text(text: str) -> str:
    """``text`` (a PDF's extracted text, all its pages) with ligatures folded,
    whitespace squeezed and hyphenated line ends joined where that is safe (see
    the module's docstring)."""
    text = _LINE_BREAK.sub("\n", text.translate(LIGATURES))
    text = _SPACE_RUN.sub(" ", text)
    lines = [line.strip(" ") for line in text.split("\n")]
    lines = _join_hyphenated(lines, _vocabulary(text))
    text = "\n".join(lines).replace(SOFT_HYPHEN, "")
    return _BLANK_RUN.sub("\n\n", text).strip("\n")


def _vocabulary(text: str) -> tuple[set[str], set[str]]:
    """The document's words (letters only, lower case) and its hyphenated
    compounds ("fine-grained"), as written within a line."""
    words = {w.lower() for w in _WORD.findall(text.replace(SOFT_HYPHEN, ""))}
    compounds = {c.lower().replace("\u2010", "-") for c in _HYPHENATED.findall(text)}
    return words, compounds


def _join_hyphenated(lines: list[str], vocabulary: tuple[set[str], set[str]]) -> list[str]:
    """Lines with words cut at their ends joined (see ``_joined``), in one pass; a
    line that held only the word's end goes (it is no paragraph break)."""
    out: list[str | None] = list(lines)
    for i in range(len(out) - 1):
        line, following = out[i], out[i + 1]
        if line is None or following is None:
            continue
        joined = _joined(line, following, vocabulary)
        if joined is not None:
            out[i], rest = joined
            out[i + 1] = rest or None
    return [line for line in out if line is not None]


def _joined(
    line: str, following: str, vocabulary: tuple[set[str], set[str]]
) -> tuple[str, str] | None:
    """``(line + the word's end, the rest of following)`` when ``line`` ends in a
    cut word that ``following`` completes; None to leave both as they are."""
    if not line or not following:
        return None
    mark = line[-1]
    if mark != SOFT_HYPHEN and mark not in _HYPHENS:
        return None
    head = _WORD.search(line[::-1][1:])
    tail = _WORD.match(following)
    if head is None or head.start() != 0 or tail is None:
        return None
    first, rest = head.group()[::-1], tail.group()
    after = following[tail.end() :].lstrip(" ")
    if after[:1] in _HYPHENS:
        return None  # the next line ends in a cut word too: leave the chain
    if mark != SOFT_HYPHEN:
        words, compounds = vocabulary
        if not rest[0].islower() or f"{first}-{rest}".lower() in compounds:
            return None
        if f"{first}{rest}".lower() not in words:
            return None
    return line[:-1] + rest, after
