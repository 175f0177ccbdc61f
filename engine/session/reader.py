"""Reading into a bounded cache: chunks are decoded, and before one would overflow
the cache the policy scores the held tokens and the cache is trimmed back to the
budget. With a known question (question-aware mode) the question's tokens are
decoded after the held text at each trim, their attention is the observation
window, and they are removed again. Sizes in tokens (= KV cells), times in seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import CacheFullError, Cancelled, ConfigError, ContextOverflowError, EngineError
from ..kv.cache import KVCache
from ..kv.context import SequenceContext
from ..native.capture import Captured, Segment
from ..native.context import Pick
from ..native.kvmemory import CacheSettings, KVLayout
from ..native.model import Model
from ..policies import Keys, Observation, Policy
from ..stats import Event, Evicted, KVStats, Progress
from . import moves
from .config import SessionConfig
from .sizing import OwnContext
from .trace import TokenTrace


class Reader:
    """One sequence in a bounded cache: what it holds (``cache``), the figures
    (``stats``), what was read (``trace``) and the last logits (``logits``)."""

    def __init__(
        self,
        model: Model,
        policy: Policy,
        config: SessionConfig,
        sizing: OwnContext,
        ctx: SequenceContext,
        kv_layout: KVLayout,
        kv_type: str,
        settings: CacheSettings,
    ) -> None:
        """``kv_type``: the cache's types as the figures name them ("f16", "q8_0/f16");
        ``settings``: the cache settings decided for the session (``CacheSettings.decide``)."""
        self.model = model
        self.policy = policy
        self.needs = policy.needs()
        self.config = config
        self.sizing = sizing
        self.ctx = ctx
        self.kv_layout = kv_layout
        self.kv_type = kv_type
        self.settings = settings
        self.max_position = config.max_position or model.info.n_ctx_train
        self.cache = KVCache(ctx, track_cells=self.reads_attention)
        self.stats = _new_stats(self)
        self.trace = TokenTrace(model_piece(self.model))
        self.logits: np.ndarray | None = None  # what the last token predicts, if read out
        # a decode computed what comes next (its ``logits``, or a token picked from them):
        # a turn ended here (``Session.can_follow_up``)
        self.predicted = False
        self.rows: np.ndarray | None = None  # every row's, when fed with ``every``
        self.t0 = time.perf_counter()  # the request's start (for the first token's time)
        self.observing = True  # attention rows read at each decode (``capture``)
        self.checkpoint: Callable[[str], None] | None = None
        """Called at "read" (a prompt's text is in, before its question) and "answer"
        (before the first token of an answer): where a caller may save the cache."""
        self.answer_stops: tuple[str, ...] = ()  # the stop strings of the latest answer
        self.planned = 0  # tokens the sequence holds and reads, as the latest feed began
        self.pending: int | None = None  # an answer's last token, not decoded (``settle``)

    def reset(self) -> None:
        """Empty the cache and forget what the policy observed."""
        self.ctx.clear()
        self.cache = KVCache(self.ctx, track_cells=self.reads_attention)
        self.pending = None
        self.policy.reset()
        self.stats = _new_stats(self)
        self.trace = TokenTrace(model_piece(self.model))
        self.logits, self.predicted = None, False
        self.planned = 0
        self.sync_stats()  # a pool counts cells from the last report: now none

    @property
    def capturing(self) -> bool:
        """Whether the context captures what the policy reads now (see ``capture``)."""
        return self.needs.hooked and getattr(self.ctx, "capture", True) is not None

    @property
    def reads_attention(self) -> bool:
        """Whether decodes read attention now (see ``capturing``)."""
        return self.needs.attention and self.capturing

    def capture(self, on: bool) -> None:
        """Read what the policy reads from now on, or not (a job that fits whole never
        evicts). A lone session moves to a context with or without the capture (its
        cells in position order: ``KVCache.rebind``); a pool keeps the callback, and
        off, decodes read only the cells they see (the cell map), no rows. An empty
        cache moves to the flash attention that suits the context: llama.cpp's
        choice without the capture (one client served 4% more requests/s with it on),
        ``CacheSettings.flash_alone`` with it. A cache holding cells keeps its context's
        (the V cache's layout differs with flash attention on and off)."""
        self.settle()
        if self.needs.hooked and self.sizing.grows and on != self.capturing:
            flash = self.flash if self.cache.n_used else moves.flash_for(self.settings, on)
            moves.move(self, self.ctx.n_ctx, on, flash)
        self.observing = on

    @property
    def flash(self) -> bool | None:
        """The flash attention option the context was made with (None: llama.cpp's)."""
        return moves.flash_of(self.ctx)

    def restoring(self, flash: bool | None) -> None:
        """Before a saved cache is loaded into this empty one: read what the policy
        reads (as ``capture(True)``), in a context with the flash attention the cache
        was saved with (their V layouts must match); one move at most."""
        hooked = self.needs.hooked
        stale = flash != self.flash or hooked != self.capturing
        if self.sizing.grows and stale and not self.cache.n_used:
            moves.move(self, self.ctx.n_ctx, hooked, flash)
        self.observing = True

    def answering(self, stops: tuple[str, ...]) -> None:
        """An answer begins (with ``stops``): the "answer" checkpoint."""
        self.answer_stops = stops
        if self.checkpoint is not None:
            self.checkpoint("answer")

    def settle(self, *, keep: bool = True) -> None:
        """Decode the answer's last token (``generate._add``) before the cache is used,
        or with ``keep=False`` drop it undecoded (a stop, a rewind), its id spent."""
        token, self.pending = self.pending, None
        if token is not None and keep:
            _settle(self, token)
        elif token is not None:
            self.cache.next_id += 1

    def rewind(self, first_id: int) -> None:
        """Forget the tokens from id ``first_id`` on (``Session.rewind``)."""
        self.settle(keep=False)
        self.cache.drop_scratch()
        self.cache.drop_tail(first_id)
        self.logits, self.predicted = None, False
        self.stats = _new_stats(self)  # the next request's own figures
        self.sync_stats()

    @property
    def question_aware(self) -> bool:
        """Whether the question votes at each eviction."""
        return self.config.question_aware and self.reads_attention and self.policy.evicts

    # -- reading ----------------------------------------------------------

    def feed(
        self,
        tokens: Sequence[int],
        *,
        observe: Sequence[int] = (),
        logits: bool = True,
        every: bool = False,
        whole: bool = False,
    ) -> Iterator[Event]:
        """Append ``tokens`` in chunks, evicting before the cache would overflow.

        ``logits``: keep the last token's logits (to generate after); ``every``:
        logits for every token (teacher forcing). ``observe`` (the question) is the
        observation window at each eviction when the session is question-aware.
        ``whole``: ``tokens`` end with ``observe``; where they fit without room for it,
        none is kept (an eviction if a pool shrinks the share first makes its own).
        """
        self.settle()
        window = list(observe) if self.question_aware else []
        reserve, total, done = len(window), len(tokens), 0
        if whole and self.cache.n_used + total <= self.sizing.limits(0)[0]:
            reserve = 0
        self.planned = max(self.planned, self.cache.next_id + total)  # decides ``auto``
        limit, target = self.sizing.limits(reserve)
        fits = self.cache.n_used + total <= limit
        if self.policy.evicts and limit - target < 1 and not fits:
            raise ConfigError(_no_room(reserve, self.max_position, self.sizing.budget))
        self.reserve(total if fits else total + reserve)
        self.sizing.reading(reserve)
        start, base = time.perf_counter(), self.stats.prefill_s
        try:
            while done < total:
                if self.sizing.follows_share:  # the pool may have changed the share
                    limit, target = self.sizing.limits(reserve)
                free = limit - self.cache.n_used
                if free < min(limit - target, total - done) or free < 1:
                    yield from self.evict(window, target=target)
                    free = limit - self.cache.n_used
                    if free < 1:
                        raise ConfigError(_no_share(self.sizing.n_ctx_max, reserve))
                n = min(total - done, free, self.ctx.n_batch)
                last = done + n == total
                self.decode(tokens[done : done + n], logits=logits and last, every=every)
                done += n
                self.stats.prompt_tokens += n
                self.stats.prefill_s = base + time.perf_counter() - start
                self.sync_stats()
                yield Progress(done, total, self.stats)
        finally:
            self.stats.prefill_s = base + time.perf_counter() - start

    def teacher_force(self, tokens: Sequence[int]) -> Iterator[np.ndarray]:
        """Append ``tokens`` (evicting as needed) and yield, block by block, the logits
        each position predicts the next token with: row i of the concatenated
        blocks predicts ``tokens[i + 1]`` (float32, ``(rows, n_vocab)``)."""
        for event in self.feed(tokens, logits=True, every=True):
            if isinstance(event, Progress):
                assert self.rows is not None
                yield self.rows
                self.rows = None

    def decode(
        self, tokens: Sequence[int], *, logits: bool, every: bool = False, pick: Pick | None = None
    ) -> int | None:
        """Decode ``tokens`` after those held (the policy observes their attention).
        ``pick``: choose the next token from the last row's logits where llama.cpp
        left them and return it; ``logits`` is then None (nothing read out: an answer's
        step, whose logits nothing else reads; not with ``every``)."""
        if pick is not None and every:
            raise EngineError("a decode picks its next token or reads every row, not both")
        self.settle()
        n = len(tokens)
        if self.cache.next_lpos + n > self.max_position:
            self.cache.compact()
        pos0 = self.cache.next_lpos
        out = {"logits": logits, "every": every, "pick": pick}
        if not self.capturing:
            self.ctx.decode(tokens, pos0, **out)
            self.cache.appended(n, _edges(self.model, self.config, tokens))
        elif self.needs.keys:
            got = self._captured(tokens, pos0, 0, visibility=False, **out)
            first = self.cache.next_id
            self.cache.appended(n, _edges(self.model, self.config, tokens))
            if got.keys is not None:
                with self.ctx.busy():
                    ids = np.arange(first, first + n, dtype=np.int64)
                    self.policy.observe(Keys(ids, got.keys))
        else:
            rows = n if self.policy.query_rows is None else self.policy.query_rows
            rows = rows if self.observing else 0
            got = self._captured(tokens, pos0, rows, visibility=True, **out)
            assert self.cache.cells is not None and got.visible is not None
            with self.ctx.busy():
                self.cache.cells.learn(got.visible, range(pos0, pos0 + n))
                self.cache.appended(n, _edges(self.model, self.config, tokens))
                if got.attn is not None:
                    self.policy.observe(_observation(self.cache, got.attn))
        return _outcome(self, n, logits, every, pick)

    def _captured(
        self, tokens: Sequence[int], pos0: int, rows: int, *, visibility: bool, **out: Any
    ) -> Captured:
        """Decode ``tokens`` at ``pos0...`` with the capture armed: the last ``rows``
        attention rows and, with ``visibility``, the cells each row could see
        (``out``: what ``decode`` reads out; no logits unless asked)."""
        seg = Segment(0, len(tokens), rows, visibility, keys=self.needs.keys)
        got = self.ctx.decode(tokens, pos0, capture=seg, **{"logits": False, **out})
        assert got is not None
        self.stats.capture_s += got.seconds
        return got

    # -- eviction ---------------------------------------------------------

    def evict(self, window: list[int], target: int | None = None) -> Iterator[Event]:
        """Trim the cache to ``target`` tokens (default: the budget), ``window`` (the
        question's tokens) voting where the policy reads attention."""
        self.settle()
        if not self.policy.evicts:
            raise ContextOverflowError(
                f"the input does not fit the {self.sizing.capacity}-token budget and policy "
                "'full' never evicts; raise --budget or choose an eviction policy"
            )
        spare = self.ctx.n_ctx - self.cache.n_used
        if window and spare < len(window):
            # no free cells for the question to vote from (an answer filled the cache):
            # make them by the policy's own scores first
            yield from self.evict([], target=max(1, self.cache.n_used - len(window) + spare))
        start = time.perf_counter()
        query = _observe_question(self, window) if window else None
        words = self.cache.words if self.config.whole_words else None
        with self.ctx.busy():
            keep = self.policy.keep(self.cache.ids, target or self.sizing.budget, query, words)
            if keep.scores is not None and keep.scored is not None:
                self.trace.score(keep.scored, keep.scores)
        removed = self.cache.keep_only(keep.ids)
        self.close_holes()
        self.stats.score_s += time.perf_counter() - start
        self.stats.evictions += 1
        self.sync_stats()
        yield Evicted(self.cache.n_used, removed, self.stats)

    def close_holes(self) -> None:
        """Renumber positions after tokens left the cache, as ``positions`` says
        (``auto``: by the text this sequence reads, decided before a read evicts)."""
        gap = self.config.hole(max(self.planned, self.cache.next_id), self.sizing.budget)
        if gap is not None:
            self.cache.compact(gap)

    # -- the context's size ----------------------------------------------

    def reserve(self, n_more: int, *, shrink: bool = False) -> None:
        """Room for ``n_more`` tokens after those held (see ``moves.reserve``)."""
        moves.reserve(self, n_more, shrink=shrink)

    # -- figures ----------------------------------------------------------

    def sync_stats(self) -> None:
        """Copy the cache's counts into ``stats`` (a pool publishes them)."""
        s = self.stats
        s.cells_used = self.cache.n_used
        s.cells_peak = max(s.cells_peak, s.cells_used)
        s.tokens_seen = self.cache.next_id
        s.evicted_tokens = self.cache.evicted
        s.compactions = self.cache.compactions
        s.n_ctx = self.ctx.n_ctx
        s.swa_cells = self.ctx.swa_cells
        self.sizing.report(s)


def _new_stats(reader: Reader) -> KVStats:
    """Fresh figures for ``reader``'s next job."""
    return KVStats(
        policy=reader.policy.name,
        budget_tokens=reader.sizing.budget,
        n_ctx=reader.ctx.n_ctx,
        kv_bytes_per_cell=reader.kv_layout.cell_bytes,
        kv_bytes_per_cell_swa=reader.kv_layout.swa_cell_bytes,
        n_swa=reader.kv_layout.n_swa,
        swa_cells=reader.ctx.swa_cells,
        kv_type=reader.kv_type,
    )


def _no_share(cells: int, reserve: int) -> str:
    """Why a pooled request cannot read on: its share is full beside the question."""
    return (
        f"this request's share of the KV pool ({cells} cells) leaves no room to read beside "
        f"a {reserve}-token question; retry when fewer requests run, or give the pool more "
        "cells"
    )


def _no_room(reserve: int, max_position: int, budget: int) -> str:
    """Why a ``reserve``-token question leaves no room to read."""
    if reserve >= max_position:  # no budget or chunk can help
        return (
            f"the question is {reserve:,} tokens, more than the model's trained context "
            f"({max_position:,} tokens) holds; shorten it"
        )
    return (
        f"budget {budget} leaves no room for a {reserve}-token question; "
        "use a smaller budget or a larger chunk"
    )


def _edges(
    model: Model, config: SessionConfig, tokens: Sequence[int]
) -> list[tuple[bool, bool, bool]] | None:
    """Each token's word edges (``Model.word_edges``), for keeping words whole."""
    if not config.whole_words:
        return None
    return [model.word_edges(t) for t in tokens]


def _outcome(reader: Reader, n: int, logits: bool, every: bool, pick: Pick | None) -> int | None:
    """After a decode of ``n`` tokens: the token ``pick`` chose (no logits read out),
    or the logits asked for (``Reader.logits``, and with ``every`` each row's)."""
    if pick is not None:
        reader.logits, reader.predicted = None, True
        return reader.ctx.picked()
    if every:
        reader.rows = reader.ctx.logits_rows(n)
        reader.logits = reader.rows[-1]
    elif logits:
        reader.logits = reader.ctx.last_logits()
    reader.predicted = reader.predicted or reader.logits is not None
    return None


def _settle(reader: Reader, token: int) -> None:
    """Decode a finished answer's last token: a Stop that came after the answer ended
    (set while nothing ran) does not stop it; stopped meanwhile or short of cells, it waits."""
    cancel = reader.ctx.cancel_event
    stale = cancel.is_set()
    cancel.clear()
    try:
        reader.decode([token], logits=True)
    except (Cancelled, CacheFullError):  # raised before llama.cpp wrote a cell
        reader.pending = token
        raise
    finally:
        if stale:
            cancel.set()


def _observe_question(reader: Reader, window: list[int]) -> Observation:
    """Decode the question after the held text, read its rows, remove it again."""
    assert reader.reads_attention
    if reader.cache.next_lpos + len(window) > reader.max_position:
        reader.cache.compact()
    rows: list[np.ndarray] = []
    pos = reader.cache.next_lpos
    try:
        for at in range(0, len(window), reader.ctx.n_batch):
            piece = window[at : at + reader.ctx.n_batch]
            got = reader._captured(piece, pos + at, len(piece), visibility=False)
            assert got.attn is not None
            rows.append(got.attn)
    finally:
        reader.cache.drop_scratch()
    width = max(r.shape[1] for r in rows)
    attn = np.vstack([np.pad(r, ((0, 0), (0, width - r.shape[1]))) for r in rows])
    return _observation(reader.cache, attn)


def _observation(cache: KVCache, attn: np.ndarray) -> Observation:
    """Attention over cells as attention over the held ids (their cells' columns)."""
    cols = cache.cell_columns()
    if len(cols) and cols.max() >= attn.shape[1]:
        attn = np.pad(attn, ((0, 0), (0, int(cols.max()) + 1 - attn.shape[1])))
    return Observation(cache.ids.copy(), attn[:, cols])


def model_piece(model: Model) -> Callable[[int], bytes]:
    """A token's bytes as the trace shows them (special tokens written out)."""
    return lambda token: model.piece(token, special=True)
