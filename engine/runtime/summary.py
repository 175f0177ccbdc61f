"""A summary that covers a document: its parts summarized one after another in the
session's bounded cache, then put together (issue 22, item 8).

Asked once for a summary of a whole long document, the 270M base model wrote one
phrase ("the following changes in release 1.2.2"), from the little of the document
the cache still held. Here the document is cut into parts at its seams
(``documents.parts``): as many as it takes for each to be read whole by the cache
(``budget + chunk`` cells, less the prompt and the answer), at most ``max_parts``;
past that a part is read with eviction like any document. Each part is read
afresh (``Session.run``: the cache never holds more than one part) and summarized
after "This section describes" (``prompts.part_summary_prompt``); that is tidied
(lines joined; a sentence cut short, looping or said before dropped; at most
``PART_SENTENCES``) and the summary is the parts' paragraphs in order.

Events: ``Progress`` over the whole summary's reading, each part's paragraph as one
``Token`` when it is done, and a ``SummaryDone`` with every part's finish reason.
Figures are the whole summary's: tokens read, generated and evicted and the reads
(``reads``) are summed over the reads; cells, KV memory and the tokens seen are the
largest any read held, the tokens seen at least the document's, so llama.cpp's
default cache is compared for the document, not for its parts read one by one.
Sizes in tokens.

After such a summary the cache holds the last part only. Where a conversation
goes on (the app, ``kvtrim chat``: ``settle``), the whole document is read once
more, with the parts' summaries as the question that votes at every eviction,
and a sentence on the whole document ends the summary ("Overall, the document
describes ..."); follow-ups then continue a cache of the whole document, and
recall evicted passages of all of it, as after a single read.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

from ..documents.parts import Part, split_parts
from ..session.core import Session
from ..session.prompts import (
    OVERVIEW_CUE,
    PART_CUE,
    Prompt,
    overview_prompt,
    part_summary_prompt,
)
from ..session.sampling import Sampling
from ..stats import Done, Event, Evicted, KVStats, Progress, Token
from .summary_text import fact_sentence, present

MAX_PARTS = 8  # parts a summary has at most: some 8-24 sentences
PART_SENTENCES = 2  # sentences kept of each part's summary: past two, mostly filler
FRAME_TOKENS = 48  # the part prompt's own tokens, with room to spare
MIN_PART_TOKENS = 256
OVERVIEW_TOKENS = 64  # the sentence on the whole document, at most


@dataclass(frozen=True)
class PartSummary:
    """One part's summary: ``text`` as kept (``tidy``), why its generation ended."""

    number: int
    title: str
    text: str
    reason: str
    generated_tokens: int
    generated: str = ""  # what the model wrote, before ``tidy``
    shown: str = ""  # ``text`` as the reader gets it (summary_text.present)


@dataclass(frozen=True)
class SummaryDone(Done):
    """The summary's end: ``text`` is every part's paragraph, ``reason`` the
    summary's (``summary_reason``), ``parts`` each part's own, ``overview`` the
    sentence on the whole document when it was settled (``Summarizer.events``)."""

    parts: tuple[PartSummary, ...] = ()
    overview: PartSummary | None = None


def part_budget(capacity: int, max_tokens: int) -> int:
    """Document tokens one part may have to be read without eviction: the cache's
    ``capacity`` less the prompt's frame and the answer."""
    return max(MIN_PART_TOKENS, capacity - FRAME_TOKENS - max_tokens)


def part_count(n_tokens: int, per_part: int, max_parts: int = MAX_PARTS) -> int:
    """Parts for a document of ``n_tokens``: each at most ``per_part``, if
    ``max_parts`` allow."""
    return max(1, min(max_parts, math.ceil(n_tokens / max(per_part, 1))))


def summary_reason(reasons: Sequence[str]) -> str:
    """The summary's finish reason from its parts': ``repetition`` or ``length`` if
    any part's generation ended so (the first such), else the last part's
    (``stop``, ``eog``); ``empty`` without parts."""
    for reason in reasons:
        if reason in ("repetition", "length"):
            return reason
    return reasons[-1] if reasons else "empty"


_WRAP_HYPHEN = re.compile(r"(?<=\w)-\n(?=\w)")
_SPACE = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+")
_TERMINAL = re.compile(r"[.!?][\"')\]]*$")
_KEY = re.compile(r"[^a-z0-9]+")


def sentences(text: str) -> list[str]:
    """``text`` as sentences, its line wraps undone (the model copies the line
    width of the text it read); the last may be unfinished."""
    flat = _SPACE.sub(" ", _WRAP_HYPHEN.sub("-", text)).strip()
    return [s.strip() for s in _SENTENCE_END.split(flat) if s.strip()]


def tidy(text: str, seen: set[str], *, finished: bool = True, limit: int = PART_SENTENCES) -> str:
    """The first ``limit`` sentences of ``text`` worth keeping: not said before
    (``seen``: their keys, updated), not looping ("the model's layers, the model's
    layers, ..."), not announcing what never comes ("... the following:"); none
    when the first is not worth it (the others say "It is ..." of it). An
    unfinished last sentence is kept (with a full stop) only when the generation
    ended on its own (``finished``: a stop string or the model's end), not when
    ``--max-tokens`` or the loop guard cut it."""
    found = sentences(text)
    if found and not _TERMINAL.search(found[-1]):
        last = found.pop().rstrip(" ,;")
        if finished and last and not last.endswith(":"):
            found.append(f"{last}.")
    kept: list[str] = []
    for sentence in found:
        key = _KEY.sub(" ", sentence.lower()).strip()
        if not key or key in seen or sentence.endswith(":") or looping(sentence):
            if not kept:
                break  # the first said nothing new: the rest hangs on it ("It is ...")
            continue
        seen.add(key)
        kept.append(sentence)
        if len(kept) == limit:
            break
    return " ".join(kept)


def looping(sentence: str, n: int = 3, share: float = 0.75) -> bool:
    """Whether fewer than ``share`` of the sentence's word ``n``-grams are distinct
    (a clause said again and again), among sentences of 8 words or more."""
    words = _KEY.sub(" ", sentence.lower()).split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(words) >= 8 and len(set(grams)) < share * len(grams)


_SUMMED = (
    "prompt_tokens", "generated_tokens", "evicted_tokens", "evictions", "compactions",
    "prefill_s", "decode_s", "capture_s", "score_s", "reads",
)  # fmt: skip
# the document's tokens are what the largest read saw, not the reads' sum: a part read
# again is not more document (issue 36: "1,224 of 19,274 tokens" for a 9,232-token text)
_LARGEST = ("cells_peak", "n_ctx", "swa_cells", "tokens_seen")


def merged(done: KVStats | None, live: KVStats) -> KVStats:
    """The summary's figures so far: ``done`` (the parts before) with the running
    part's ``live`` figures added (summed counts, the largest cells)."""
    if done is None:
        return dataclasses.replace(live)
    out = dataclasses.replace(live)
    for name in _SUMMED:
        setattr(out, name, getattr(done, name) + getattr(live, name))
    for name in _LARGEST:
        setattr(out, name, max(getattr(done, name), getattr(live, name)))
    out.first_token_s = done.first_token_s
    return out


class Summarizer:
    """Summarizes documents part by part in ``session`` (see the module's
    docstring); ``parts`` holds the last document's parts."""

    def __init__(
        self,
        session: Session,
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] | None = None,
        system: str = "",
        answer_prefix: str = "",
        max_parts: int = MAX_PARTS,
    ) -> None:
        """``max_tokens``: each part's summary at most; ``stops``: None for the part
        prompt's own; ``answer_prefix``: the summary's first words (the first part's
        cue, where "This section describes" starts the others)."""
        self.session = session
        self.max_tokens = max_tokens
        self.sampling = sampling or Sampling()
        self.stops = stops
        self.system = system
        self.answer_prefix = answer_prefix.strip()
        self.max_parts = max_parts
        self.parts: list[Part] = []
        self.doc_tokens = 0  # the last document's tokens

    def plan(self, document: str) -> tuple[list[Part], list[int]]:
        """The document's parts and each one's estimated tokens (by its share of the
        characters, with the prompt's frame), as many parts as ``part_count`` says."""
        n_tokens = self.doc_tokens = len(self.session.model.tokenize(document))
        per_part = part_budget(self.session.capacity, self.max_tokens)
        parts = split_parts(document, part_count(n_tokens, per_part, self.max_parts))
        share = n_tokens / max(len(document), 1)
        return parts, [round((p.end - p.start) * share) + FRAME_TOKENS for p in parts]

    def events(self, document: str, *, settle: bool = False) -> Iterator[Event]:
        """Read and summarize ``document``. ``settle``: after a summary of several
        parts, read the whole document once more with the parts' summaries as the
        question and add a sentence on the whole (``prompts.overview_prompt``), so
        the cache holds the document for follow-ups (the chat's and the app's
        turns), not the last part; one more read."""
        self.parts, estimates = self.plan(document)
        settling = settle and len(self.parts) > 1
        if settling:
            estimates.append(sum(estimates))
        tally = _Tally(time.perf_counter())
        model = self.session.model
        for i, part in enumerate(self.parts):
            cue = self._cue(i)
            prompt = part_summary_prompt(model, part.text(document), cue, self.system)
            done = yield from self._read(prompt, tally, estimates[i:], self.max_tokens)
            yield from self._keep(tally, part.number, part.title, cue, done, part.text(document))
        if settling:
            kept = [r.text for r in tally.results if r.text]
            prompt = overview_prompt(model, document, kept, system=self.system)
            limit = min(self.max_tokens, OVERVIEW_TOKENS)
            done = yield from self._read(prompt, tally, estimates[-1:], limit)
            yield from self._keep(tally, 0, "", OVERVIEW_CUE, done, limit=1)
        assert tally.totals is not None
        tally.totals.tokens_seen = max(tally.totals.tokens_seen, self.doc_tokens)
        yield from self._cut_short(tally)
        text = self._shown("\n\n".join(r.shown for r in tally.results if r.shown), first=True)
        reason = summary_reason([r.reason for r in tally.results])
        parts = tuple(r for r in tally.results if r.number)
        overview = next((r for r in tally.results if not r.number), None)
        yield SummaryDone(text, reason, tally.totals, parts, overview)

    def _read(
        self, prompt: Prompt, tally: _Tally, estimates: list[int], max_tokens: int
    ) -> Generator[Event, None, Done]:
        """Run ``prompt`` (a fresh cache), its progress and evictions over the whole
        summary's figures (``estimates``: this read's tokens and those after it);
        returns its ``Done``."""
        stops = list(prompt.stops if self.stops is None else self.stops)
        events = self.session.run(
            prompt, max_tokens=max_tokens, sampling=self.sampling, stops=stops
        )
        before = tally.totals.prompt_tokens if tally.totals else 0
        head: int | None = None  # this read's prompt tokens, as its first progress tells
        done: Done | None = None
        for event in events:
            if isinstance(event, Done):
                done = event
                continue
            if isinstance(event, Progress):
                head = event.total if head is None else max(head, event.total)
            if isinstance(event, (Progress, Evicted)):
                ahead = (estimates[0] if head is None else head) + sum(estimates[1:])
                yield _remapped(event, tally.totals, before, ahead)
        assert done is not None
        tally.totals = merged(tally.totals, done.stats)
        return done

    def _keep(
        self,
        tally: _Tally,
        number: int,
        title: str,
        cue: str,
        done: Done,
        source: str = "",
        limit: int = 0,
    ) -> Iterator[Event]:
        """Tidy what ``done`` wrote after ``cue``, keep it, and show it as a ``Token``
        without kvtrim's cue, with the most fact-dense sentence of ``source`` (the
        part's text) that the model's words leave out."""
        finished = done.reason in ("stop", "eog")
        raw = f"{cue} {done.text.strip()}"
        text = tidy(raw, tally.seen, finished=finished, limit=limit or PART_SENTENCES)
        fact = fact_sentence(source, text) if source else None
        shown = present(text, cue, title, fact) if text or fact else ""
        generated = done.stats.generated_tokens
        part = PartSummary(number, title, text, done.reason, generated, done.text, shown)
        tally.results.append(part)
        if not shown:
            return
        if tally.totals is not None and tally.totals.first_token_s is None:
            tally.totals.first_token_s = time.perf_counter() - tally.start
        first = not any(r.shown for r in tally.results[:-1])
        yield Token(-1, self._shown(shown, first=first), tally.totals or done.stats)

    def _cut_short(self, tally: _Tally) -> Iterator[Event]:
        """Where ``tidy`` kept nothing of any part (every sentence cut short by a low
        ``--max-tokens``), the first part's words as written, ended with "…": a short
        summary, never an empty one."""
        if any(r.shown for r in tally.results):
            return
        first = next((r for r in tally.results if r.generated.strip()), None)
        if first is None:
            return
        cue = self._cue(0) if first is tally.results[0] else PART_CUE
        at = tally.results.index(first)
        text = f"{cue} {first.generated.strip()}…"
        shown = present(text, cue, first.title)
        tally.results[at] = dataclasses.replace(first, text=text, shown=shown)
        yield Token(-1, self._shown(shown, first=True), tally.totals)

    def _cue(self, index: int) -> str:
        return self.answer_prefix if index == 0 and self.answer_prefix else PART_CUE

    def _shown(self, text: str, *, first: bool) -> str:
        """``text`` as the reader gets it: after a blank line unless it is the first
        paragraph, which loses ``answer_prefix`` (the caller shows it first)."""
        if not first:
            return f"\n\n{text}"
        if self.answer_prefix and text.startswith(self.answer_prefix):
            return text[len(self.answer_prefix) :].lstrip()
        return text


@dataclass
class _Tally:
    """One summary's running state: its start (``time.perf_counter``), figures so
    far, what each part kept and the sentences said."""

    start: float
    totals: KVStats | None = None
    results: list[PartSummary] = dataclasses.field(default_factory=list)
    seen: set[str] = dataclasses.field(default_factory=set)


def _remapped(event: Progress | Evicted, totals: KVStats | None, before: int, ahead: int) -> Event:
    """A read's event over the whole summary: tokens read so far, the figures summed
    with the reads before (``before`` tokens)."""
    stats = merged(totals, event.stats)
    if isinstance(event, Evicted):
        return Evicted(event.kept, event.removed, stats)
    done = before + event.stats.prompt_tokens
    return Progress(done, max(done, before + ahead), stats)
