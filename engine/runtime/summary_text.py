"""A summary as its reader sees it (issue 36, item 7): the model's words without the
frame that steered it, and the document's own facts.

The part prompts end with a cue the model continues ("This section describes ...",
"Overall, the document describes ..."): the cue is the prompt's wording, not the
model's, so ``present`` takes it off and names the part by its heading instead
("Installing: how to unpack the archive."). A small model's sentences are often
generic; the part's most fact-dense sentence, quoted from the document
(``fact_sentence``: numbers, names), is added where the model's words hold none of
it, so "The pass key is 68142." is in the summary of a document that says so.
"""

from __future__ import annotations

import re

from ..session.prompts import OVERVIEW_CUE, PART_CUE

TITLE_CHARS = 60  # a heading longer than this is cut, with "…"
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*|\d[\d,.:/-]*\d|\d")
_NUMBER = re.compile(r"\d{2,}|\d[.,:/-]\d")
_NAME = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+(?: [A-Z][a-z]+)*")
_SPLIT = re.compile(r"(?<=[.!?])[\"')\]”]*\s+(?=[A-Z0-9\"“(])|\n\s*\n|\n(?=\s*[-*#>|])")
_CUES = {PART_CUE: "", OVERVIEW_CUE: "Overall"}


def facts_in(text: str) -> set[str]:
    """The numbers and names of ``text`` (as a reader would check them)."""
    return set(_NUMBER.findall(text)) | set(_NAME.findall(text))


def fact_sentence(source: str, said: str = "") -> str | None:
    """The sentence of ``source`` richest in numbers and names, 4-40 words of prose
    (not code or a table line), whose facts ``said`` does not already hold; None if
    there is none."""
    best, best_score = None, 0.0
    for piece in _SPLIT.split(source):
        sentence = " ".join(piece.split())
        if not sentence.endswith((".", "!", "?")) or not (
            sentence[:1].isupper() or sentence[:1] in '"“'
        ):
            continue  # a heading, a code line, a list item, a sentence cut off
        words = _WORD.findall(sentence)
        letters = sum(c.isalpha() for c in sentence)
        if not 4 <= len(words) <= 40 or letters < 0.6 * len(sentence.replace(" ", "")):
            continue
        numbers, names = set(_NUMBER.findall(sentence)), set(_NAME.findall(sentence))
        new = (numbers | names) - facts_in(said)
        if not new:
            continue
        score = (2 * len(numbers & new) + len(names & new)) / (1 + len(words) / 20)
        if score > best_score:
            best, best_score = sentence, score
    return best


def present(text: str, cue: str, title: str = "", fact: str | None = None) -> str:
    """``text`` (a part's kept sentences, starting with ``cue``) as shown: the cue
    taken off and the part named by ``title`` (or "Overall"), and ``fact`` quoted
    after it. A cue that is no frame of kvtrim's (the user's answer prefix) stays."""
    body = text
    label = ""  # the user's own answer prefix starts the text as it is
    if cue in _CUES and body.startswith(cue):
        body = body[len(cue) :].strip()
        label = title or _CUES[cue]
        if not label:
            body = body[:1].upper() + body[1:]
    if fact:
        body = f"{body} “{fact}”" if body else f"“{fact}”"
    label = label.strip().rstrip(":").strip()
    if label and body:
        label = label if len(label) <= TITLE_CHARS else label[: TITLE_CHARS - 1].rstrip() + "…"
        return f"{label}: {body}"
    return body
