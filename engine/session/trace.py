"""Which parts of the source text the cache still holds.

Every token a session decodes gets an id (0, 1, 2, ... in reading order, as in
kvcache.py). ``TokenTrace`` remembers, per id, the text it came from (a
``Segment``: the prompt, the document, the question, an answer, a chat turn)
and its character span there, plus the latest score the policy gave it.
``MemoryMap`` is a snapshot: per segment, each token's span, role and score.
Units: spans are Python string indices (characters) into ``Segment.text``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

# roles of a token in a MemoryMap
UNREAD, EVICTED, SCORED, SINK, RECENT = 0, 1, 2, 3, 4
TOP, HEADING = 5, 6  # display roles: among the strongest scores; a segment heading
RECALLED = 7  # evicted, and a copy re-decoded for the latest follow-up (recall.py)
TOP_SHARE = 0.1  # the top tenth of kept-by-score tokens count as the strongest
SEGMENT_TITLES = {"turn": "your message", "recalled": "brought back for your question"}
KEPT_ROLES = (SCORED, SINK, RECENT, TOP, RECALLED)  # roles of characters the cache holds
ROLE_NAMES = {
    UNREAD: "unread",
    EVICTED: "evicted",
    SCORED: "kept by score",
    SINK: "sink",
    RECENT: "recent",
    RECALLED: "brought back",
}


def _char_spans(data: bytes, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The character index each byte offset (0..len(data)) of UTF-8 ``data`` falls
    in, for ``starts`` and ``ends``; the end of the data maps to the number of
    characters. Works in 5 bytes per byte of data (int32 counts; documents stay
    far below 2**31 bytes)."""
    if not data:
        return np.zeros(len(starts), np.int64), np.zeros(len(ends), np.int64)
    first = (np.frombuffer(data, dtype=np.uint8) & 0xC0) != 0x80  # not a continuation byte
    counts = np.cumsum(first, dtype=np.int32)  # characters begun at or before each byte

    def index(offsets: np.ndarray) -> np.ndarray:
        inside = np.minimum(offsets, len(data) - 1)
        return counts[inside].astype(np.int64) - (offsets < len(data))

    return index(starts), index(ends)


def byte_spans(pieces: Sequence[bytes], data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Byte ``(starts, ends)`` of each token's piece in ``data``.

    Exact when the pieces concatenate to the text (Gemma's tokenizer, and any
    without an added space prefix); a space prefix the text does not have is
    skipped; otherwise spans are spread in proportion (a coarse map, not a crash).
    """
    lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
    joined = b"".join(pieces)
    shift = 0
    if joined != data and joined[1:] == data and joined[:1] == b" ":
        shift = 1
    elif joined != data:
        total = max(int(lengths.sum()), 1)
        lengths = np.round(lengths * (len(data) / total)).astype(np.int64)
    ends = np.minimum(np.cumsum(lengths) - shift, len(data)).clip(0)
    starts = np.concatenate(([0], ends[:-1]))
    return starts, ends


@dataclass
class Segment:
    """A run of consecutive token ids that came from one text."""

    name: str
    text: str
    first_id: int
    char_starts: np.ndarray
    char_ends: np.ndarray

    @property
    def n_tokens(self) -> int:
        return len(self.char_starts)


@dataclass
class MemoryMap:
    """A snapshot: ``roles[i]``/``scores[i]`` (NaN: never scored) per segment's tokens."""

    policy: str
    budget_tokens: int
    tokens_seen: int
    tokens_kept: int
    segments: list[Segment]
    roles: list[np.ndarray]
    scores: list[np.ndarray]

    @property
    def retention(self) -> float:
        """Tokens held / tokens read (1.0 before any token)."""
        return self.tokens_kept / self.tokens_seen if self.tokens_seen else 1.0

    @functools.cached_property
    def display(self) -> tuple[str, np.ndarray]:
        """``display_roles`` of this map, computed on first use: the app's worker asks
        where the map is made, so the window's thread only looks it up (about 0.1 s
        for a 35,000-token document)."""
        return _display_roles(self)

    def segment(self, name: str) -> int:
        """Index of the first segment called ``name``."""
        return next(i for i, s in enumerate(self.segments) if s.name == name)

    def char_roles(self, index: int, *, strongest: bool = False) -> np.ndarray:
        """One role per character of segment ``index`` (characters no token covers,
        like a byte-fallback tail, take the role of the token before). ``strongest``
        marks the top ``TOP_SHARE`` of kept-by-score tokens as ``TOP``."""
        seg = self.segments[index]
        roles = self.roles[index]
        out = np.full(len(seg.text), UNREAD, dtype=np.uint8)
        for start, end, role in zip(seg.char_starts, seg.char_ends, roles, strict=True):
            out[start : max(end, start + 1)] = role
        scores = self.scores[index]
        scored = (roles == SCORED) & np.isfinite(scores)
        if strongest and scored.sum() >= 10:
            cut = np.quantile(scores[scored], 1 - TOP_SHARE)
            for j in np.flatnonzero(scored & (scores >= cut)):
                start, end = seg.char_starts[j], seg.char_ends[j]
                out[start : max(end, start + 1)] = TOP
        return out


@dataclass
class TokenTrace:
    """Source spans and latest scores of every id a session has decoded or will."""

    piece: Callable[[int], bytes]
    _segments: list[Segment] = field(default_factory=list)
    scores: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    _answer: list[bytes] = field(default_factory=list)  # the last segment's pieces, if an answer
    _spanned: int = 0  # how many of them its text and spans hold
    _pieces: dict[int, bytes] = field(default_factory=dict)  # at most the vocabulary

    @property
    def segments(self) -> list[Segment]:
        """The segments, the answer's text and spans brought up to date: a token costs
        O(1) as it is generated and the spans are made once for each read."""
        n = len(self._answer)
        if n != self._spanned:
            seg, pieces = self._segments[-1], self._answer[:n]
            data = b"".join(pieces)
            seg.text = data.decode("utf-8", errors="replace")
            seg.char_starts, seg.char_ends = _char_spans(data, *byte_spans(pieces, data))
            self._spanned = n
        return self._segments

    @segments.setter
    def segments(self, segments: list[Segment]) -> None:
        self._segments, self._answer, self._spanned = segments, [], 0

    def _piece(self, token: int) -> bytes:
        """``piece(token)``, asked once per distinct token: a long document repeats
        its tokens, and each answer is one shared bytes object."""
        found = self._pieces.get(token)
        if found is None:
            found = self._pieces[token] = self.piece(token)
        return found

    @property
    def n_ids(self) -> int:
        if not self._segments:
            return 0
        last = self._segments[-1]
        return last.first_id + (len(self._answer) if self._answer else last.n_tokens)

    def add(self, name: str, text: str | None, tokens: Sequence[int]) -> None:
        """``tokens`` (of ``text``; None: the tokens' own text) get the next ids; call
        before decoding them."""
        if not tokens:
            return
        pieces = [self._piece(t) for t in tokens]
        if text is None:
            text = b"".join(pieces).decode("utf-8", errors="replace")
        data = text.encode("utf-8", errors="replace")
        char_starts, char_ends = _char_spans(data, *byte_spans(pieces, data))
        segments = self.segments
        segments.append(Segment(name, text, self.n_ids, char_starts, char_ends))
        self.segments = segments  # the answer before, if any, is whole
        self._grow()

    def truncate(self, n_ids: int) -> None:
        """Forget the sources of ids ``n_ids`` and after (a question that was added
        but never read: a saved read restored for another question)."""
        kept = []
        for seg in self.segments:
            if seg.first_id >= n_ids:
                break
            if seg.first_id + seg.n_tokens > n_ids:
                keep = n_ids - seg.first_id
                seg = dataclasses.replace(
                    seg, char_starts=seg.char_starts[:keep], char_ends=seg.char_ends[:keep]
                )
                seg.text = seg.text[: int(seg.char_ends[-1]) if keep else 0]
            kept.append(seg)
        self.segments = kept

    def start_answer(self, name: str = "answer") -> None:
        segments = self.segments
        segments.append(Segment(name, "", self.n_ids, np.zeros(0, np.int64), np.zeros(0, np.int64)))
        self.segments = segments

    def add_answer_token(self, token: int) -> None:
        """One generated token, decoded after the others of the current answer."""
        self._answer.append(self._piece(token))
        self._grow()

    def score(self, ids: np.ndarray, scores: np.ndarray) -> None:
        if len(ids):
            self._grow(int(ids.max()) + 1)  # ids fed without a source (teacher forcing)
            self.scores[ids] = scores

    def _grow(self, n: int = 0) -> None:
        n = max(n, self.n_ids)
        if len(self.scores) < n:
            grown = np.full(max(n, 2 * len(self.scores)), np.nan, dtype=np.float32)
            grown[: len(self.scores)] = self.scores
            self.scores = grown

    def snapshot(
        self,
        held: np.ndarray,
        next_id: int,
        n_sink: int,
        recent: int,
        policy: str,
        budget: int,
        recalled: np.ndarray | None = None,
    ) -> MemoryMap:
        """Roles from the held ids (sorted): the first ``n_sink`` are sinks, the newest
        ``recent`` the recent window, other held ids were kept by score; ids below
        ``next_id`` not held were evicted, ids from ``next_id`` on are unread.
        ``recalled``: evicted ids whose copy the cache holds (a follow-up's excerpt)."""
        role = np.full(max(self.n_ids, next_id), UNREAD, dtype=np.uint8)
        role[:next_id] = EVICTED
        role[held] = SCORED
        role[held[:n_sink]] = SINK
        if recent:
            role[held[-recent:]] = RECENT
        if recalled is not None and len(recalled):
            back = recalled[role[recalled] == EVICTED]
            role[back] = RECALLED
        roles, scores = [], []
        for seg in self.segments:
            ids = slice(seg.first_id, seg.first_id + seg.n_tokens)
            roles.append(role[ids].copy())
            scores.append(self.scores[ids].copy())
        # copies: the answer segment keeps growing after the snapshot is handed over
        segments = [dataclasses.replace(seg) for seg in self.segments]
        return MemoryMap(policy, budget, next_id, len(held), segments, roles, scores)


def display_roles(m: MemoryMap) -> tuple[str, np.ndarray]:
    """All segments as one text with a heading each, and a role per character
    (``TOP`` for the strongest-scored kept tokens, ``HEADING`` for headings).
    Computed once per map (``MemoryMap.display``)."""
    return m.display


def _display_roles(m: MemoryMap) -> tuple[str, np.ndarray]:
    texts: list[str] = []
    roles: list[np.ndarray] = []
    for i, seg in enumerate(m.segments):
        if not seg.text.strip():
            continue
        heading = f"── {SEGMENT_TITLES.get(seg.name, seg.name)} ──\n"
        texts += [heading, seg.text, "\n\n"]
        roles += [
            np.full(len(heading), HEADING, np.uint8),
            m.char_roles(i, strongest=True),
            np.zeros(2, np.uint8),
        ]
    if not texts:
        return "", np.zeros(0, np.uint8)
    return "".join(texts), np.concatenate(roles)


def strip(roles: np.ndarray, cells: int) -> tuple[np.ndarray, list[str]]:
    """``roles`` squeezed into ``cells`` equal slices (a minimap): each cell's share
    of kept characters, and its class: "top" when it holds a strongest score, else
    "recalled" when a follow-up brought some of it back, else
    "kept" when at least half is kept, "evicted" when any was evicted, "unread"."""
    edges = np.linspace(0, len(roles), cells + 1).astype(np.int64)
    start = edges[:-1]
    stop = np.minimum(np.maximum(edges[1:], start + 1), len(roles))
    length = stop - start

    def count(mask: np.ndarray) -> np.ndarray:  # per cell, without a loop over cells
        total = np.concatenate(([0], np.cumsum(mask, dtype=np.int64)))
        return total[stop] - total[start]

    kept = count(np.isin(roles, KEPT_ROLES))
    shares = np.divide(kept, length, out=np.zeros(cells), where=length > 0)
    top, recalled, evicted = (count(roles == r) > 0 for r in (TOP, RECALLED, EVICTED))
    classes = [
        "top" if t else "recalled" if r else "kept" if s >= 0.5 else "evicted" if e else "unread"
        for t, r, s, e in zip(top, recalled, shares, evicted, strict=True)
    ]
    return shares, classes
