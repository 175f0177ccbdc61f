"""A session: a bounded KV cache that reads text of any length and generates.

The cache holds ``n_ctx = budget + chunk`` cells. Text is decoded in chunks;
before a chunk would overflow the cache, the policy scores the held tokens and
the cache is trimmed back to ``budget`` tokens. With a known question
(question-aware mode) the question's tokens are decoded after the held text at
each trim, their attention is the observation window, and they are removed
again. Work is reported as events (see stats.py) from generators.
"""

from __future__ import annotations

import codecs
import functools
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import Cancelled, ConfigError, ContextOverflowError
from ..kv.cache import KVCache
from ..kv.context import PooledSequence, SequenceContext
from ..native.capture import AttentionCapture, Captured, Segment
from ..native.context import NativeContext
from ..native.kvmemory import KV_TYPES, SWA_CACHES, CacheSettings, pad, type_name
from ..native.model import Model
from ..policies import Observation, Policy
from ..stats import Done, Event, Evicted, KVStats, Progress, Recalled, Result, Token
from .prompts import EXCERPT_GAP, Prompt, ask_prompt, follow_up_prompt, summary_prompt
from .recall import WINDOW_TOKENS as RECALL_WINDOW
from .recall import Excerpt, Recall
from .sampling import LoopGuard, Sampler, Sampling, StopMatcher
from .sizing import MIN_CHUNK, OwnContext, PoolShare
from .trace import MemoryMap, TokenTrace

MAX_BATCH = 512  # tokens per llama_decode (llama.cpp's default micro-batch)
POSITION_MODES = ("compact", "original", "bounded")
"""After an eviction, ``compact`` renumbers the kept tokens 0..n-1 (``seq_shift``),
as StreamingLLM and llama.cpp's context shift do; ``original`` keeps the
positions the tokens were read at (the H2O/SnapKV papers) and compacts only
before passing the trained context; ``bounded`` shortens each hole an eviction
leaves to at most ``BOUNDED_GAP`` positions, so distances stay ordered but small."""
BOUNDED_GAP = 64  # positions a hole keeps in ``bounded`` mode (positions_probe.py: 16 and 64)


@dataclass(frozen=True)
class SessionConfig:
    """Sizes in tokens (= KV cells). ``chunk_tokens`` defaults to budget / 4.

    ``positions``: see ``POSITION_MODES``. Compact is the default because on the
    default model it decides whether a kept fact is found at all (a 9K-token
    passkey document, budget 1024: found with compact, missed with original).

    ``swa_cache``: see ``kvmemory.SWA_CACHES``; the budget bounds the global layers,
    sliding-window layers keep window + batch cells (``window``) or a cell per held
    token (``full``). ``kv_type``: K cache type, and V's too where flash attention
    runs (policies that read no attention). ``whole_words``: a word (a number's
    digits) is kept or evicted whole (see ``policies.base.word_max``).
    ``recall_tokens``: how many evicted document tokens a follow-up question may
    bring back (see ``Session.follow_up``); None: a chunk, 0: none.
    """

    budget_tokens: int = 1024
    chunk_tokens: int | None = None
    question_aware: bool = True
    positions: str = "compact"
    max_position: int | None = None
    n_threads: int | None = None
    flash_attn: str = "auto"
    batch_tokens: int = MAX_BATCH  # tokens per llama_decode call at most
    swa_cache: str = "window"
    kv_type: str = "f16"
    whole_words: bool = True
    recall_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.swa_cache not in SWA_CACHES:
            raise ConfigError(f"swa_cache must be one of {', '.join(SWA_CACHES)}")
        if self.kv_type not in KV_TYPES:
            raise ConfigError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        if not 1 <= self.batch_tokens <= 65536:
            raise ConfigError(f"batch must be 1..65536 tokens, got {self.batch_tokens}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise ConfigError("flash_attn must be auto, on or off")
        if self.positions not in POSITION_MODES:
            raise ConfigError(f"positions must be one of {', '.join(POSITION_MODES)}")
        if self.recall_tokens is not None and self.recall_tokens < 0:
            raise ConfigError("recall_tokens must be >= 0")

    def chunk(self) -> int:
        return self.chunk_tokens or max(MIN_CHUNK * 4, self.budget_tokens // 4)

    def recall(self) -> int:
        """Document tokens a follow-up may bring back (see recall.py); default: a chunk,
        at least two windows."""
        if self.recall_tokens is not None:
            return self.recall_tokens
        return max(self.chunk(), 2 * RECALL_WINDOW)


def default_threads() -> int:
    try:
        import psutil

        return psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover
        return os.cpu_count() or 1


class Session:
    """One sequence in a bounded cache, evicted by ``policy``.

    By default the session owns a llama.cpp context; with ``slot`` (a ``pool.slot.Slot``)
    it is one sequence of a shared context, its cache bounded by the slot's share.
    """

    def __init__(
        self,
        model: Model,
        policy: Policy,
        config: SessionConfig | None = None,
        *,
        slot: PooledSequence | None = None,
    ) -> None:
        self.model = model
        self.policy = policy
        self.config = config = config or SessionConfig()
        budget, chunk = config.budget_tokens, config.chunk()
        if budget < MIN_CHUNK:
            raise ConfigError(f"budget must be at least {MIN_CHUNK} tokens, got {budget}")
        if chunk < MIN_CHUNK:
            raise ConfigError(f"chunk must be at least {MIN_CHUNK} tokens, got {chunk}")
        if policy.evicts and budget < policy.protected(budget) + 1:
            raise ConfigError(
                f"budget {budget} is too small for {policy.name}: it keeps "
                f"{policy.protected(budget)} sink and recent tokens"
            )
        self.max_position = config.max_position or model.info.n_ctx_train
        self.reads_attention = policy.needs_attention
        if self.reads_attention and not model.info.global_layers:
            raise ConfigError(
                f"{policy.name} needs attention, but kvtrim does not know which layers of "
                f"{model.info.arch} see the whole cache; use streaming or full"
            )
        self.sizing = (
            OwnContext(policy, budget, chunk)
            if slot is None
            else PoolShare(policy, budget, chunk, slot=slot)
        )
        if self.n_ctx_max >= self.max_position:
            raise ConfigError(
                f"budget + chunk ({self.n_ctx_max}) must be below {self.max_position}"
            )
        room = chunk if policy.evicts else self.n_ctx_max
        info = model.info
        cache = CacheSettings.decide(
            reads_attention=self.reads_attention,
            kv_type=config.kv_type,
            flash_attn=config.flash_attn,
            swa_cache=config.swa_cache,
            window_layers_unknown=info.n_swa > 0 and not info.n_swa_layers,
            who=policy.name,
        )
        n_batch = min(room, config.batch_tokens)
        # the cache grows with the text up to n_ctx_max (see _reserve): a short
        # document never holds more cells than llama.cpp would give it
        self.ctx: SequenceContext
        if slot is not None:
            why = slot.cache_settings.refusal(cache)
            if why is not None:
                raise ConfigError(f"this request cannot run in the shared KV pool: {why}")
            self.ctx, cache = slot, slot.cache_settings
        else:
            capture = AttentionCapture(info.global_layers) if self.reads_attention else None
            self.ctx = NativeContext(
                model,
                n_ctx=min(self.n_ctx_max, pad(n_batch)),
                n_batch=n_batch,
                n_threads=config.n_threads or default_threads(),
                capture=capture,
                flash_attn=cache.flash_attn,
                swa_full=cache.swa_full,
                type_k=cache.type_k,
                type_v=cache.type_v,
            )
        type_k, type_v = cache.type_k, cache.type_v
        self.kv_layout = info.kv_layout(type_k, type_v)
        self.kv_type_v = type_name(type_v)
        self.cache = KVCache(self.ctx, track_cells=self.reads_attention)
        self.stats = self._new_stats()
        self.trace = self._new_trace()
        self._logits: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._t0 = time.perf_counter()
        self._document: tuple[int, list[int]] | None = None  # first id, tokens
        self._recall: Recall | None = None
        self._recall_ids = np.zeros(0, dtype=np.int64)  # excerpt ids in the cache
        self._recall_src = np.zeros(0, dtype=np.int64)  # the document ids they copy

    # -- sizes (see sizing.py: a pooled session's follow its share) ------------

    @property
    def n_ctx_max(self) -> int:
        """Cells this session may ever hold (the question's scratch included)."""
        return self.sizing.n_ctx_max

    @property
    def capacity(self) -> int:
        """Cells the text may fill before the policy evicts (budget + chunk)."""
        return self.sizing.capacity

    @property
    def budget(self) -> int:
        """Tokens the policy keeps at an eviction (in a pool, as its share allows)."""
        return self.sizing.budget

    # -- public API -------------------------------------------------------

    def prepare(self, n_tokens: int) -> None:
        """Size the cache for a job of ``n_tokens`` (prompt and answer) before it runs,
        as ``run`` does: ``min(budget + chunk, n_tokens)`` cells, rounded up."""
        self.reset()
        self._reserve(n_tokens, shrink=True)
        self._sync_stats()

    def cancel(self) -> None:
        """Stop the running prefill or generation soon (thread-safe)."""
        self.ctx.cancel_event.set()

    def reset(self) -> None:
        """Empty the cache and forget what the policy observed."""
        self.ctx.clear()
        self.cache = KVCache(self.ctx, track_cells=self.reads_attention)
        self.policy.reset()
        self.stats = self._new_stats()
        self.trace = self._new_trace()
        self._logits = None
        self._document = None
        self._recall = None
        self._recall_ids = self._recall_src = np.zeros(0, dtype=np.int64)

    def ask(
        self,
        document: str,
        question: str,
        *,
        answer_prefix: str = "",
        system: str = "",
        **gen: object,
    ) -> Iterator[Event]:
        """Read ``document`` and answer ``question`` (see ``run`` for options)."""
        prompt = ask_prompt(self.model, document, question, answer_prefix, system)
        return self.run(prompt, **gen)  # type: ignore[arg-type]

    def summarize(self, document: str, *, system: str = "", **gen: object) -> Iterator[Event]:
        """Read ``document`` and summarize it (see ``run`` for options)."""
        prompt = summary_prompt(self.model, document, system=system)
        return self.run(prompt, **gen)  # type: ignore[arg-type]

    def follow_up(
        self,
        question: str,
        *,
        answer_prefix: str = "",
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] = (),
    ) -> Iterator[Event]:
        """The next chat turn: append ``question`` after the last answer and generate
        (``stops``: more stop strings, beside the prompt's own).

        The cache keeps what earlier turns left in it, so a chat goes on past the
        budget; the question is the observation window of any eviction it needs.
        When the first read evicted document text, the windows of it that best
        match the question (BM25, see recall.py) are re-decoded inside the turn,
        up to ``recall_tokens``; the previous turn's excerpt is dropped first, and
        the held text is trimmed (the question voting) so the turn and the answer
        fit the cache without growing it.
        """
        if self._logits is None:
            raise ConfigError("nothing to follow up: ask or summarize first")
        self.ctx.cancel_event.clear()
        self._t0 = time.perf_counter()
        self.stats.first_token_s = None
        self.stats.recalled_tokens = 0
        self._drop_recall()
        plain = follow_up_prompt(self.model, question, answer_prefix)
        tail = self.model.tokenize(plain.suffix, markup=plain.suffix_markup)
        excerpts, prompt, head = [], plain, []
        answer = min(max_tokens, self.config.chunk())  # a longer answer evicts as it goes
        room = self._recall_room(len(tail), answer)
        if room > 0:
            excerpts = self._pick(question, tail, room, answer)
        if excerpts:
            prompt = follow_up_prompt(self.model, question, answer_prefix, excerpt=True)
            head = self.model.tokenize(prompt.prefix, markup=prompt.prefix_markup)
            tail = self.model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
        body, src, texts = self._excerpt_tokens(excerpts)
        self.trace.add("turn", prompt.prefix, head)
        first = self.trace.n_ids
        self.trace.add("recalled", EXCERPT_GAP.join(texts), body)
        self.trace.add("turn", prompt.suffix, tail)
        if body:
            self._recall_ids = np.arange(first, first + len(body), dtype=np.int64)
            self._recall_src = src
            self.stats.recalled_tokens = int((src >= 0).sum())
            yield Recalled(tuple(texts), len(body), self.stats)
        turn_id, answered = self.cache.next_id, False
        try:
            yield from self.feed(head + body + tail, observe=tail, logits=True)
            gen = self.generate(
                max_tokens=max_tokens,
                sampling=sampling or Sampling(),
                stops=(*prompt.stops, *stops),
            )
            for event in gen:
                answered = answered or isinstance(event, Token)
                yield event
        except BaseException:
            if not answered:  # stopped before a word of the answer: as if never asked
                self._roll_back(turn_id)
            raise

    @property
    def can_follow_up(self) -> bool:
        """Whether a turn ended here (an answer, whole or stopped), so ``follow_up``
        can continue; False before the first read ends or after it was cancelled."""
        return self._logits is not None

    def run(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] | None = None,
    ) -> Iterator[Event]:
        """Fresh cache, read the prompt (evicting as needed), then generate. A cancel
        that comes while the prompt is tokenized (seconds for a long document) stops
        the run at its first step: the cancel event is cleared before, not after."""
        self.ctx.cancel_event.clear()
        head = self.model.tokenize(
            prompt.prefix, add_bos=prompt.add_bos, markup=prompt.prefix_markup
        )
        body = self.model.tokenize(prompt.document)
        tail = self.model.tokenize(prompt.suffix, markup=prompt.suffix_markup)
        sources = [
            ("prompt", prompt.prefix, head),
            ("document", prompt.document, body),
            ("question", prompt.suffix, tail),
        ]
        if not tail:
            raise ConfigError("the prompt's last part (the question) is empty")
        return self._run_tokens(
            head + body,
            tail,
            max_tokens=max_tokens,
            sampling=sampling,
            stops=stops if stops is not None else prompt.stops,
            sources=sources,
        )

    def run_tokens(
        self,
        head: Sequence[int],
        tail: Sequence[int],
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] = (),
        sources: Sequence[tuple[str, str | None, Sequence[int]]] | None = None,
    ) -> Iterator[Event]:
        """Fresh cache; read ``head`` (evicting as needed, with ``tail`` as the question
        that votes), then ``tail``, then generate. ``tail`` must not be empty.

        ``sources``: ``(name, text, tokens)`` whose tokens are ``head + tail`` in
        order, for the memory map; by default the two parts' own text."""
        if not tail:
            raise ConfigError("the prompt's last part (the question) is empty")
        self.ctx.cancel_event.clear()
        return self._run_tokens(
            head, tail, max_tokens=max_tokens, sampling=sampling, stops=stops, sources=sources
        )

    def _run_tokens(
        self,
        head: Sequence[int],
        tail: Sequence[int],
        *,
        max_tokens: int,
        sampling: Sampling | None,
        stops: Sequence[str],
        sources: Sequence[tuple[str, str | None, Sequence[int]]] | None,
    ) -> Iterator[Event]:
        self.reset()
        self._reserve(len(head) + len(tail) + max_tokens, shrink=True)
        self._t0 = time.perf_counter()
        for name, text, tokens in sources or [("prompt", None, head), ("question", None, tail)]:
            if name == "document" and tokens:
                self._document = (self.trace.n_ids, list(tokens))
            self.trace.add(name, text, tokens)
        yield from self.feed(head, observe=tail, logits=False)
        yield from self.feed(tail, logits=True)
        yield from self.generate(
            max_tokens=max_tokens, sampling=sampling or Sampling(), stops=tuple(stops)
        )

    def feed(
        self,
        tokens: Sequence[int],
        *,
        observe: Sequence[int] = (),
        logits: bool = True,
        every: bool = False,
    ) -> Iterator[Event]:
        """Append ``tokens`` in chunks, evicting before the cache would overflow.

        ``logits``: keep the last token's logits (to generate after); ``every``:
        logits for every token (teacher forcing).

        ``observe`` (the question) is the observation window at each eviction
        when the session is question-aware and the policy reads attention.
        """
        window = list(observe) if self._question_aware() else []
        reserve = len(window)
        total, done = len(tokens), 0
        limit, target = self.sizing.limits(reserve)
        room = limit - target
        fits = self.cache.n_used + total <= limit
        if self.policy.evicts and room < 1 and not fits and reserve >= self.max_position:
            raise ConfigError(  # no budget or chunk can help
                f"the question is {reserve:,} tokens, more than the model's trained context "
                f"({self.max_position:,} tokens) holds; shorten it"
            )
        if self.policy.evicts and room < 1 and not fits:
            raise ConfigError(
                f"budget {self.budget} leaves no room for a {reserve}-token question; "
                "use a smaller budget or a larger chunk"
            )
        self._reserve(total if fits else total + reserve)
        self.sizing.reading(reserve)
        start, base = time.perf_counter(), self.stats.prefill_s
        try:
            while done < total:
                if self.sizing.follows_share:  # the pool may have changed the share
                    limit, target = self.sizing.limits(reserve)
                    room = limit - target
                free = limit - self.cache.n_used
                if free < min(room, total - done) or free < 1:
                    yield from self._evict(window, target=target)
                    free = limit - self.cache.n_used
                    if free < 1:
                        raise ConfigError(
                            f"this request's share of the KV pool ({self.n_ctx_max} cells) "
                            f"leaves no room to read beside a {reserve}-token question; "
                            "retry when fewer requests run, or give the pool more cells"
                        )
                n = min(total - done, free, self.ctx.n_batch)
                last = done + n == total
                self._decode(tokens[done : done + n], logits=logits and last, every=every)
                done += n
                self.stats.prompt_tokens += n
                self.stats.prefill_s = base + time.perf_counter() - start
                self._sync_stats()
                yield Progress(done, total, self.stats)
        finally:
            self.stats.prefill_s = base + time.perf_counter() - start

    def _close_holes(self) -> None:
        """Renumber positions after tokens left the cache, as ``positions`` says."""
        if self.config.positions == "compact":
            self.cache.compact()
        elif self.config.positions == "bounded":
            self.cache.compact(BOUNDED_GAP)

    def teacher_force(self, tokens: Sequence[int]) -> Iterator[np.ndarray]:
        """Append ``tokens`` (evicting as needed) and yield, block by block, the logits
        each position predicts the next token with: row i of the concatenated
        blocks predicts ``tokens[i + 1]`` (float32, ``(rows, n_vocab)``)."""
        for event in self.feed(tokens, logits=True, every=True):
            if isinstance(event, Progress):
                assert self._rows is not None
                yield self._rows
                self._rows = None

    def generate(
        self,
        *,
        max_tokens: int,
        sampling: Sampling,
        stops: tuple[str, ...] = (),
    ) -> Iterator[Event]:
        """Generate up to ``max_tokens`` tokens after what was fed. A stop string the
        model wrote leaves the cache again (its tokens are removed), so the next turn's
        markup follows the answer's own text."""
        if self._logits is None:
            raise ConfigError("nothing to continue from: feed a prompt first")
        self._reserve(max_tokens)
        sample = Sampler(sampling)
        looping = LoopGuard()
        matcher = StopMatcher(stops)
        stop_tags = set(stops)
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        start, base = time.perf_counter(), self.stats.decode_s
        reason = "length"
        self.trace.start_answer()
        starts: list[tuple[int, int]] = []  # (id, characters of the answer before it)
        try:
            for _ in range(max_tokens):
                with self.ctx.busy():
                    token = sample(self._logits)
                if self.stats.first_token_s is None:
                    self.stats.first_token_s = time.perf_counter() - self._t0
                if self.model.is_eog(token):
                    reason = "eog"
                    break
                if stop_tags and self._is_stop_tag(token, stop_tags):
                    reason = "stop"
                    break
                if self.cache.n_used >= self.capacity:
                    yield from self._evict([])
                self.trace.add_answer_token(token)
                self._decode([token], logits=True)
                self.stats.generated_tokens += 1
                self.stats.decode_s = base + time.perf_counter() - start
                starts.append((self.cache.next_id - 1, len(matcher.text)))
                text, hit = matcher.feed(utf8.decode(self.model.piece(token)))
                if hit:
                    self._forget_stop(starts, len(matcher.text))
                self._sync_stats()
                yield Token(token, text, self.stats)
                if hit:
                    reason = "stop"
                    break
                if looping(token):
                    reason = "repetition"
                    break
        finally:
            self.stats.decode_s = base + time.perf_counter() - start
        tail = matcher.flush() + (utf8.decode(b"", final=True) if reason != "stop" else "")
        if tail:
            yield Token(-1, tail, self.stats)
        yield Done(matcher.text, reason, self.stats)

    def _forget_stop(self, starts: list[tuple[int, int]], kept: int) -> None:
        """Remove the generated tokens that begin at or after character ``kept`` of
        the answer (the stop string and anything after it) from the cache."""
        gone = [i for i, at in starts if at >= kept]
        if gone:
            self.cache.drop_tail(min(gone))

    def _is_stop_tag(self, token: int, tags: set[str]) -> bool:
        """A control token whose text is a stop (a turn end the GGUF does not list
        as end of generation: see ``prompts.turn_stops``)."""
        if self.model.piece(token):
            return False  # plain text: the stop matcher sees it
        return self.model.piece(token, special=True).decode("utf-8", "replace") in tags

    def memory_map(self) -> MemoryMap:
        """What the cache holds now, mapped to the source text (see trace.py).

        O(tokens read): cheap enough to call between events of a long prefill.
        """
        held = self.cache.ids
        n_sink = min(self.policy.n_sink, len(held))
        recent = self.policy.recent_for(self.budget) if self.policy.evicts else 0
        if self.policy.recency_only:
            recent = len(held) - n_sink
        copies = np.isin(self._recall_ids, held)
        src = self._recall_src[copies]
        return self.trace.snapshot(
            held,
            self.cache.next_id,
            n_sink,
            min(recent, len(held) - n_sink),
            self.policy.name,
            self.budget,
            recalled=src[src >= 0],
        )

    def close(self) -> None:
        self.ctx.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------

    def _new_stats(self) -> KVStats:
        kv_type = self.config.kv_type
        if self.kv_type_v != kv_type:
            kv_type = f"{kv_type}/{self.kv_type_v}"  # K/V
        return KVStats(
            policy=self.policy.name,
            budget_tokens=self.budget,
            n_ctx=self.ctx.n_ctx,
            kv_bytes_per_cell=self.kv_layout.cell_bytes,
            kv_bytes_per_cell_swa=self.kv_layout.swa_cell_bytes,
            n_swa=self.kv_layout.n_swa,
            swa_cells=self.ctx.swa_cells,
            kv_type=kv_type,
        )

    def _reserve(self, n_more: int, *, shrink: bool = False) -> None:
        """Make the cache big enough for ``n_more`` tokens after those held, up to
        ``n_ctx_max`` (past it the policy evicts). ``shrink``: an empty cache may also
        get smaller (a new, shorter document)."""
        if not self.sizing.grows:
            return  # a pool's share is fixed when the sequence is admitted
        want = min(self.n_ctx_max, max(pad(self.cache.n_used + n_more), pad(self.ctx.n_batch)))
        if want > self.ctx.n_ctx or (shrink and want < self.ctx.n_ctx and not self.cache.n_used):
            self._resize(want)

    def _resize(self, n_ctx: int) -> None:
        """Move the sequence into a new context of ``n_ctx`` cells (llama.cpp cannot
        resize a cache in place); the cells keep their order (see KVCache.rebind)."""
        if self.cache.shift_pending:
            self._apply_shifts()
        new = self.ctx.resized(n_ctx)
        try:
            if self.cache.n_used:
                new.load_seq(self.ctx.save_seq())
        except BaseException:
            new.close()
            raise
        old, self.ctx = self.ctx, new
        self.cache.rebind(new)
        old.close()
        self.stats.n_ctx = new.n_ctx
        self.stats.swa_cells = new.swa_cells

    def _roll_back(self, turn_id: int) -> None:
        """Undo a turn stopped while it was read (cancel, error): its tokens leave
        the cache, which ends again at the last answer, whose logits are kept."""
        self.cache.drop_scratch()
        self.cache.drop_tail(turn_id)
        self._recall_ids = self._recall_src = np.zeros(0, dtype=np.int64)
        self._sync_stats()

    def _drop_recall(self) -> None:
        """Remove the previous turn's excerpt from the cache (its answer stays)."""
        gone = self._recall_ids
        self._recall_ids = self._recall_src = np.zeros(0, dtype=np.int64)
        held = np.isin(self.cache.ids, gone)
        if not held.any():
            return
        self.cache.keep_only(self.cache.ids[~held], evicted=False)  # a copy, not the text
        self._close_holes()
        self._sync_stats()

    def _recall_room(self, n_turn: int, max_tokens: int) -> int:
        """Excerpt tokens this turn can hold: ``recall_tokens``, less what the held
        text cannot give up (half the budget stays for the first read's memory)."""
        if not self.policy.evicts or self._document is None or not self.cache.evicted:
            return 0
        spare = self.capacity - n_turn - max_tokens - self.budget // 2 - 8
        return max(0, min(self.config.recall(), spare - self._excerpt_frame(spare)))

    @functools.cached_property
    def _gap(self) -> list[int]:
        """The tokens of ``EXCERPT_GAP``, put between two excerpts."""
        return self.model.tokenize(EXCERPT_GAP)

    def _excerpt_frame(self, room: int) -> int:
        """Tokens around ``room`` excerpt tokens: the intro and the gaps between them."""
        return 8 + len(self._gap) * max(1, room // (RECALL_WINDOW // 2))

    def _pick(self, question: str, tail: list[int], room: int, max_tokens: int) -> list[Excerpt]:
        """Make room for ``room`` excerpt tokens, the turn and the answer (evicting
        with the question voting), then choose the excerpts."""
        assert self._document is not None
        first, tokens = self._document
        if self._recall is None:
            self._recall = Recall(tokens, self.model.piece)
            self.stats.recall_host_bytes = self._recall.host_bytes
        need = room + self._excerpt_frame(room) + len(tail) + max_tokens
        target = self.capacity - need
        if self.cache.n_used > target:
            window = tail if self._question_aware() else []
            for _ in self._evict(window, target=target):
                pass
        ids = np.arange(first, first + len(tokens), dtype=np.int64)
        held = np.isin(ids, self.cache.ids)
        return self._recall.pick(question, held, room)

    def _excerpt_tokens(self, excerpts: list[Excerpt]) -> tuple[list[int], np.ndarray, list[str]]:
        """The excerpts' tokens joined by ``EXCERPT_GAP``, the document id each copies
        (-1 for the gaps), and each excerpt's text."""
        body: list[int] = []
        src: list[int] = []
        texts: list[str] = []
        if not excerpts:
            return body, np.zeros(0, dtype=np.int64), texts
        assert self._document is not None
        first, tokens = self._document
        for i, e in enumerate(excerpts):
            if i:
                body += self._gap
                src += [-1] * len(self._gap)
            body += tokens[e.start : e.stop]
            src += range(first + e.start, first + e.stop)
            texts.append(self.model.detokenize(tokens[e.start : e.stop]))
        return body, np.asarray(src, dtype=np.int64), texts

    def _apply_shifts(self) -> None:
        """llama.cpp applies position shifts at the next decode and does not save them:
        decode one scratch token and remove it again."""
        self.ctx.decode([0], self.cache.next_lpos, logits=False)
        self.cache.drop_scratch()
        self.cache.shift_pending = False

    def _new_trace(self) -> TokenTrace:
        return TokenTrace(lambda token: self.model.piece(token, special=True))

    def _question_aware(self) -> bool:
        return self.config.question_aware and self.reads_attention and self.policy.evicts

    def _sync_stats(self) -> None:
        s = self.stats
        s.cells_used = self.cache.n_used
        s.cells_peak = max(s.cells_peak, s.cells_used)
        s.tokens_seen = self.cache.next_id
        s.evicted_tokens = self.cache.evicted
        s.compactions = self.cache.compactions
        s.n_ctx = self.ctx.n_ctx
        s.swa_cells = self.ctx.swa_cells
        self.sizing.report(s)

    def _decode(self, tokens: Sequence[int], *, logits: bool, every: bool = False) -> None:
        n = len(tokens)
        if self.cache.next_lpos + n > self.max_position:
            self.cache.compact()
        pos0 = self.cache.next_lpos
        if not self.reads_attention:
            self.ctx.decode(tokens, pos0, logits=logits, every=every)
            self.cache.appended(n, self._edges(tokens))
        else:
            rows = n if self.policy.query_rows is None else self.policy.query_rows
            got = self._captured(tokens, pos0, rows, visibility=True, logits=logits, every=every)
            assert self.cache.cells is not None and got.visible is not None
            with self.ctx.busy():
                self.cache.cells.learn(got.visible, range(pos0, pos0 + n))
                self.cache.appended(n, self._edges(tokens))
                if got.attn is not None:
                    self.policy.observe(self._observation(got.attn))
        if every:
            self._rows = self.ctx.logits_rows(n)
            self._logits = self._rows[-1]
        elif logits:
            self._logits = self.ctx.last_logits()

    def _captured(
        self,
        tokens: Sequence[int],
        pos0: int,
        rows: int,
        *,
        visibility: bool,
        logits: bool = False,
        every: bool = False,
    ) -> Captured:
        """Decode ``tokens`` at ``pos0...`` with the capture armed: the last ``rows``
        attention rows and, with ``visibility``, the cells each row could see."""
        seg = Segment(0, len(tokens), rows, visibility)
        got = self.ctx.decode(tokens, pos0, logits=logits, every=every, capture=seg)
        assert got is not None
        self.stats.capture_s += got.seconds
        return got

    def _edges(self, tokens: Sequence[int]) -> list[tuple[bool, bool, bool]] | None:
        if not self.config.whole_words:
            return None
        return [self.model.word_edges(t) for t in tokens]

    def _observation(self, attn: np.ndarray) -> Observation:
        cols = self.cache.cell_columns()
        if len(cols) and cols.max() >= attn.shape[1]:
            attn = np.pad(attn, ((0, 0), (0, int(cols.max()) + 1 - attn.shape[1])))
        return Observation(self.cache.ids.copy(), attn[:, cols])

    def _observe_question(self, window: list[int]) -> Observation:
        """Decode the question after the held text, read its rows, remove it again."""
        assert self.reads_attention
        if self.cache.next_lpos + len(window) > self.max_position:
            self.cache.compact()
        rows: list[np.ndarray] = []
        pos = self.cache.next_lpos
        try:
            for at in range(0, len(window), self.ctx.n_batch):
                piece = window[at : at + self.ctx.n_batch]
                got = self._captured(piece, pos + at, len(piece), visibility=False)
                assert got.attn is not None
                rows.append(got.attn)
        finally:
            self.cache.drop_scratch()
        width = max(r.shape[1] for r in rows)
        attn = np.vstack([np.pad(r, ((0, 0), (0, width - r.shape[1]))) for r in rows])
        return self._observation(attn)

    def _evict(self, window: list[int], target: int | None = None) -> Iterator[Event]:
        """Trim the cache to ``target`` tokens (default: the budget), ``window`` (the
        question's tokens) voting where the policy reads attention."""
        if not self.policy.evicts:
            raise ContextOverflowError(
                f"the input does not fit the {self.capacity}-token budget and policy 'full' "
                "never evicts; raise --budget or choose an eviction policy"
            )
        spare = self.ctx.n_ctx - self.cache.n_used
        if window and spare < len(window):
            # no free cells for the question to vote from (an answer filled the cache):
            # make them by the policy's own scores first
            yield from self._evict([], target=max(1, self.cache.n_used - len(window) + spare))
        start = time.perf_counter()
        query = self._observe_question(window) if window else None
        words = self.cache.words if self.config.whole_words else None
        with self.ctx.busy():
            keep = self.policy.keep(self.cache.ids, target or self.budget, query, words)
            if keep.scores is not None and keep.scored is not None:
                self.trace.score(keep.scored, keep.scores)
        removed = self.cache.keep_only(keep.ids)
        self._close_holes()
        self.stats.score_s += time.perf_counter() - start
        self.stats.evictions += 1
        self._sync_stats()
        yield Evicted(self.cache.n_used, removed, self.stats)

    @staticmethod
    def collect(events: Iterator[Event], model: str = "") -> Result:
        """Run ``events`` to the end and return the answer with its figures."""
        for count, event in enumerate(events, start=1):
            if isinstance(event, Done):
                return Result(event.text, event.reason, event.stats, model, count)
        raise Cancelled("the run ended without an answer")
