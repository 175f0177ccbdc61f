"""Bringing back evicted document text for a follow-up question.

A cache compressed while it read "summarize this" has evicted the details a later
question asks about (issue 13: SnapKV at budget 1,024 found 1 of 4 planted facts
after a summary). ``Recall`` keeps the document's token ids in host RAM, splits
them into overlapping windows, and ranks the windows for a question with BM25
(Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond",
2009; ``rank_bm25.BM25Okapi``). The session re-decodes the best windows that lost
tokens, as an excerpt inside the question's turn: a few hundred tokens of prefill
instead of a fresh read of the whole document, and the device cache stays within
its cells. Units: tokens; host memory in bytes.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from rank_bm25 import BM25Okapi

WINDOW_TOKENS = 64  # tokens per window; windows overlap by half
_WORD = re.compile(r"\w+", re.UNICODE)
# words too common to tell windows apart; BM25's idf weighs the rest
_STOP_WORDS = (
    "a an and are as at be by for from has have how in is it its of on or that the this "
    "to was were what when where which who whom whose why will with does did do you your "
    "i me my we our they their he she his her them there here about into than then so "
    "can could should would please tell give say document text"
)
_STOP = frozenset(_STOP_WORDS.split(" "))


def words(text: str) -> list[str]:
    """Lower-case word terms of ``text`` without stop words (BM25's terms)."""
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


@dataclass(frozen=True)
class Excerpt:
    """Document tokens ``[start, stop)`` (offsets into the document) to re-decode."""

    start: int
    stop: int
    score: float


class Recall:
    """A BM25 index over windows of one document's tokens (kept in host RAM)."""

    def __init__(
        self,
        tokens: Sequence[int],
        piece: Callable[[int], bytes],
        window: int = WINDOW_TOKENS,
    ) -> None:
        """``tokens``: the document as the session fed it; ``piece``: a token's bytes."""
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.window = max(8, window)
        stride = self.window // 2
        n = len(self.tokens)
        self.starts = np.arange(0, max(n - stride, 1), stride, dtype=np.int64)
        texts = [
            b"".join(piece(int(t)) for t in self.tokens[s : s + self.window]).decode(
                "utf-8", errors="replace"
            )
            for s in self.starts
        ]
        terms = [words(t) or ["\x00"] for t in texts]  # BM25Okapi needs no empty window
        self._bm25 = BM25Okapi(terms)
        self.host_bytes = self._size(terms)

    def _size(self, terms: list[list[str]]) -> int:
        """Host memory of the index: token ids, window terms and BM25's tables."""
        size = self.tokens.nbytes + self.starts.nbytes
        size += sum(sys.getsizeof(t) + sum(sys.getsizeof(w) for w in t) for t in terms)
        for table in self._bm25.doc_freqs:
            size += sys.getsizeof(table)
        size += sys.getsizeof(self._bm25.idf) + sys.getsizeof(self._bm25.doc_len)
        return int(size)

    def scores(self, question: str) -> np.ndarray:
        """BM25 score of each window for ``question`` (float64, one per window)."""
        query = words(question)
        if not query:
            return np.zeros(len(self.starts))
        return np.asarray(self._bm25.get_scores(query), dtype=np.float64)

    def pick(self, question: str, held: np.ndarray, limit: int) -> list[Excerpt]:
        """The best-scoring windows that lost tokens, at most ``limit`` tokens in all,
        merged where they overlap, in document order.

        ``held``: a bool per document token, whether the cache still holds it; a
        window the cache holds whole is not brought back. Windows that score 0 (no
        question term) are never picked."""
        if limit < 1 or not len(self.tokens):
            return []
        scores = self.scores(question)
        n = len(self.tokens)
        taken = np.zeros(n, dtype=bool)
        count = 0  # tokens taken
        best: dict[int, float] = {}
        for w in np.argsort(-scores, kind="stable"):
            if scores[w] <= 0:
                break
            s = int(self.starts[w])
            e = min(s + self.window, n)
            if held[s:e].all():
                continue
            new = int((~taken[s:e]).sum())
            if count + new > limit:
                continue
            taken[s:e] = True
            count += new
            best[s] = max(best.get(s, 0.0), float(scores[w]))
        return self._runs(taken, best)

    @staticmethod
    def _runs(taken: np.ndarray, best: dict[int, float]) -> list[Excerpt]:
        out: list[Excerpt] = []
        idx = np.flatnonzero(taken)
        if not len(idx):
            return out
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        for run in np.split(idx, breaks):
            a, b = int(run[0]), int(run[-1]) + 1
            score = max((v for s, v in best.items() if a <= s < b), default=0.0)
            out.append(Excerpt(a, b, score))
        return out
