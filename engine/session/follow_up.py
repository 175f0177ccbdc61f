"""Follow-up turns, and bringing back what the first read evicted.

The first read is compressed for the first request; the details a later question
asks about may be gone. The document's token ids stay in host RAM; for each
follow-up the 64-token windows of it that best match the question (BM25, see
recall.py) are re-decoded inside the turn, up to ``recall_tokens``. The previous
turn's excerpt leaves the cache first, and the held text is trimmed (the question
voting) so the turn and the answer fit without growing the cache. Sizes in tokens.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Generator, Iterator, Sequence

import numpy as np

from ..stats import Event, Recalled, Token
from .generate import generate
from .prompts import EXCERPT_GAP, follow_up_prompt
from .reader import Reader
from .recall import WINDOW_TOKENS as RECALL_WINDOW
from .recall import Excerpt, Recall
from .sampling import Sampling, with_sentence_stop

_NONE = np.zeros(0, dtype=np.int64)
ANSWER_ROOM = 32
"""Tokens of the answer a turn makes room for before recalling (an answer that runs
longer evicts as it grows, as any read does): a factual answer is 5-20 tokens, and
each token kept for it is one fewer recalled (it was ``min(max_tokens, chunk)``: 64-256
at the CLI's 128 max tokens, where the fidelity run measured recall with 24)."""


class FollowUps:
    """The document a session read (its first id and tokens), the recall index made
    from it on the first follow-up, and which held ids are a recalled copy."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.document: tuple[int, list[int]] | None = None  # first id, tokens
        self.recall: Recall | None = None
        self.copy_ids = _NONE  # excerpt ids in the cache
        self.copy_src = _NONE  # the document ids they copy (-1: a gap between excerpts)

    def reset(self) -> None:
        self.document, self.recall = None, None
        self.copy_ids = self.copy_src = _NONE

    def turn(
        self,
        question: str,
        *,
        answer_prefix: str,
        max_tokens: int,
        sampling: Sampling,
        stops: Sequence[str],
    ) -> Iterator[Event]:
        """Append ``question`` after the last answer, with excerpts of the evicted
        document where there is room, and generate. A turn stopped before a word of
        the answer leaves the cache as if it was never asked."""
        self._begin()
        model = self.reader.model
        prompt = follow_up_prompt(model, question, answer_prefix)
        head, tail = [], model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
        excerpts = self._excerpts(question, tail, max_tokens)
        if excerpts:
            prompt = follow_up_prompt(model, question, answer_prefix, excerpt=True)
            head = model.tokenize(prompt.prefix, markup=prompt.prefix_markup)
            tail = model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
        self.reader.trace.add("turn", prompt.prefix, head)
        body = yield from self._recall(excerpts)
        self.reader.trace.add("turn", prompt.suffix, tail)
        gen = (max_tokens, sampling, with_sentence_stop((*prompt.stops, *stops), answer_prefix))
        yield from self._answer(head + body + tail, tail, *gen)

    def reask(
        self,
        tail: Sequence[int],
        question: str,
        *,
        max_tokens: int,
        sampling: Sampling,
        stops: Sequence[str],
        restart_clock: bool = True,
    ) -> Iterator[Event]:
        """Another question about the text the cache holds (a saved read restored, or
        a request rewound to the end of its text): the text was compressed for an
        earlier question, so the windows of it that best match ``question`` come back
        first (after the text, before ``tail``, the question's own tokens). Also a
        first question's, with ``recall_first`` (``restart_clock`` False: the request
        began with its read)."""
        self._begin(restart_clock)
        self.reader.trace.truncate(self.reader.cache.next_id)  # a question never read
        tail = list(tail)
        excerpts = self._excerpts(question, tail, max_tokens)
        body = yield from self._recall(excerpts)
        self.reader.trace.add("question", None, tail)
        yield from self._answer(body + tail, tail, max_tokens, sampling, tuple(stops))

    def _begin(self, restart_clock: bool = True) -> None:
        r = self.reader
        if restart_clock:
            r.t0 = time.perf_counter()
        r.stats.first_token_s = None
        r.stats.recalled_tokens = 0
        self._drop_copy()

    def _excerpts(self, question: str, tail: list[int], max_tokens: int) -> list[Excerpt]:
        """Evicted windows of the document for ``question``, as room allows."""
        answer = min(max_tokens, ANSWER_ROOM)  # a longer answer evicts as it grows
        room = self._room(len(tail), answer)
        return self._pick(question, tail, room, answer) if room > 0 else []

    def _recall(self, excerpts: list[Excerpt]) -> Generator[Event, None, list[int]]:
        """The excerpts' tokens, traced and announced; returns them."""
        r = self.reader
        body, src, texts = self._excerpt_tokens(excerpts)
        first = r.trace.n_ids
        r.trace.add("recalled", EXCERPT_GAP.join(texts), body)
        if body:
            self.copy_ids = np.arange(first, first + len(body), dtype=np.int64)
            self.copy_src = src
            r.stats.recalled_tokens = int((src >= 0).sum())
            yield Recalled(tuple(texts), len(body), r.stats)
        return body

    def _answer(
        self,
        tokens: list[int],
        tail: list[int],
        max_tokens: int,
        sampling: Sampling,
        stops: tuple[str, ...],
    ) -> Iterator[Event]:
        """Read ``tokens`` (``tail`` voting) and answer; stopped before a word of the
        answer, the cache is as if it was never asked."""
        r = self.reader
        turn_id, answered = r.cache.next_id, False
        try:
            yield from r.feed(tokens, observe=tail, logits=True)
            for event in generate(r, max_tokens=max_tokens, sampling=sampling, stops=stops):
                answered = answered or isinstance(event, Token)
                yield event
        except BaseException:
            if not answered:
                self._roll_back(turn_id)
            raise

    def recalled(self) -> np.ndarray:
        """The document ids whose recalled copies the cache holds now."""
        src = self.copy_src[np.isin(self.copy_ids, self.reader.cache.ids)]
        return src[src >= 0]

    def _roll_back(self, turn_id: int) -> None:
        """Undo a turn stopped while it was read (cancel, error): its tokens leave
        the cache, which ends again at the last answer, whose logits are kept."""
        cache = self.reader.cache
        cache.drop_scratch()
        cache.drop_tail(turn_id)
        self.copy_ids = self.copy_src = _NONE
        self.reader.sync_stats()

    def _drop_copy(self) -> None:
        """Remove the previous turn's excerpt from the cache (its answer stays)."""
        r, gone = self.reader, self.copy_ids
        self.copy_ids = self.copy_src = _NONE
        held = np.isin(r.cache.ids, gone)
        if not held.any():
            return
        r.cache.keep_only(r.cache.ids[~held], evicted=False)  # a copy, not the text
        r.close_holes()
        r.sync_stats()

    def _room(self, n_turn: int, max_tokens: int) -> int:
        """Excerpt tokens this turn can hold: ``recall_tokens``, less what the held
        text cannot give up (half the budget stays for the first read's memory)."""
        r = self.reader
        if not r.policy.evicts or self.document is None or not r.cache.evicted:
            return 0
        spare = r.sizing.capacity - n_turn - max_tokens - r.sizing.budget // 2 - 8
        return max(0, min(r.config.recall(), spare - self._frame(spare)))

    @functools.cached_property
    def _gap(self) -> list[int]:
        """The tokens of ``EXCERPT_GAP``, put between two excerpts."""
        return self.reader.model.tokenize(EXCERPT_GAP)

    def _frame(self, room: int) -> int:
        """Tokens around ``room`` excerpt tokens: the intro and the gaps between them."""
        return 8 + len(self._gap) * max(1, room // (RECALL_WINDOW // 2))

    def _pick(self, question: str, tail: list[int], room: int, max_tokens: int) -> list[Excerpt]:
        """Make room for ``room`` excerpt tokens, the turn and the answer (evicting
        with the question voting), then choose the excerpts."""
        assert self.document is not None
        r, (first, tokens) = self.reader, self.document
        if self.recall is None:
            self.recall = Recall(tokens, r.model.piece)
            r.stats.recall_host_bytes = self.recall.host_bytes
        target = r.sizing.capacity - (room + self._frame(room) + len(tail) + max_tokens)
        if r.cache.n_used > target:
            for _ in r.evict(tail if r.question_aware else [], target=target):
                pass
        ids = np.arange(first, first + len(tokens), dtype=np.int64)
        return self.recall.pick(question, np.isin(ids, r.cache.ids), room)

    def _excerpt_tokens(self, excerpts: list[Excerpt]) -> tuple[list[int], np.ndarray, list[str]]:
        """The excerpts' tokens joined by ``EXCERPT_GAP``, the document id each copies
        (-1 for the gaps), and each excerpt's text."""
        body: list[int] = []
        src: list[int] = []
        texts: list[str] = []
        if not excerpts:
            return body, _NONE, texts
        assert self.document is not None
        first, tokens = self.document
        for i, e in enumerate(excerpts):
            if i:
                body += self._gap
                src += [-1] * len(self._gap)
            body += tokens[e.start : e.stop]
            src += range(first + e.start, first + e.stop)
            texts.append(self.reader.model.detokenize(tokens[e.start : e.stop]))
        return body, np.asarray(src, dtype=np.int64), texts
