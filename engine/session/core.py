"""A session: a bounded KV cache that reads text of any length and generates.

The cache holds ``n_ctx = budget + chunk`` cells. ``Session`` is the facade the
command line, the server, the app and the benchmarks use; the work is done by its
parts: ``reader.Reader`` (chunked reading with eviction, the question voting),
``generate.generate`` (sampling and stops), ``follow_up.FollowUps`` (the next turn,
with recall of evicted text) and ``sizing`` (an own context that grows, or a pool's
share). Work is reported as events (see stats.py) from generators.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import Cancelled, ConfigError
from ..kv.cache import KVCache
from ..kv.context import PooledSequence, SequenceContext
from ..native.kvmemory import type_name
from ..native.model import Model
from ..policies import Policy
from ..stats import Done, Event, KVStats, Result
from . import state
from .config import (
    BOUNDED_GAP,
    MAX_BATCH,
    POSITION_MODES,
    SessionConfig,
    default_threads,
)
from .follow_up import FollowUps
from .generate import generate
from .prompts import Prompt, ask_prompt, prompt_tokens, summary_prompt
from .reader import Reader
from .sampling import Sampling, with_sentence_stop
from .sizing import MIN_CHUNK, OwnContext, PoolShare
from .state import SavedState
from .trace import MemoryMap, TokenTrace

__all__ = [
    "BOUNDED_GAP",
    "MAX_BATCH",
    "MIN_CHUNK",
    "POSITION_MODES",
    "Session",
    "SessionConfig",
    "default_threads",
]

Sources = Sequence[tuple[str, str | None, Sequence[int]]]


def collect(events: Iterator[Event], model: str = "") -> Result:
    """Run ``events`` to the end and return the answer with its figures."""
    for count, event in enumerate(events, start=1):
        if isinstance(event, Done):
            return Result(event.text, event.reason, event.stats, model, count)
    raise Cancelled("the run ended without an answer")


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
        _check(model, policy, config)
        args = (policy, budget, chunk)
        self.sizing = OwnContext(*args) if slot is None else PoolShare(*args, slot=slot)
        self.reader = _reader(model, policy, config, self.sizing)
        self.turns = FollowUps(self.reader)

    # -- what the parts hold ------------------------------------------------

    @property
    def ctx(self) -> SequenceContext:
        return self.reader.ctx

    @property
    def cache(self) -> KVCache:
        return self.reader.cache

    @property
    def stats(self) -> KVStats:
        return self.reader.stats

    @property
    def trace(self) -> TokenTrace:
        return self.reader.trace

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

    @property
    def can_follow_up(self) -> bool:
        """Whether a turn (an answer, whole or stopped) ended here, not cancelled."""
        return self.reader.predicted

    # -- public API -------------------------------------------------------

    def prepare(self, n_tokens: int) -> None:
        """Size the cache for a job of ``n_tokens`` (prompt and answer) before it runs,
        as ``run`` does: ``min(budget + chunk, n_tokens)`` cells, rounded up."""
        self.reset()
        self.reader.reserve(n_tokens, shrink=True)
        self.reader.sync_stats()

    def cancel(self) -> None:
        """Stop the running prefill or generation soon (thread-safe)."""
        self.ctx.cancel_event.set()

    def reset(self) -> None:
        """Empty the cache and forget what the policy observed."""
        self.reader.reset()
        self.turns.reset()

    def ask(
        self,
        document: str,
        question: str,
        *,
        answer_prefix: str = "",
        system: str = "",
        **gen: object,
    ) -> Iterator[Event]:
        """Read ``document`` and answer ``question`` (see ``run`` for options); with
        ``answer_prefix`` the answer ends after its first sentence (``SENTENCE_END``)."""
        prompt = ask_prompt(self.model, document, question, answer_prefix, system)
        given = gen.pop("stops", None)
        stops = prompt.stops if given is None else tuple(given)  # type: ignore[arg-type]
        gen["stops"] = with_sentence_stop(stops, answer_prefix)
        return self.run(prompt, question=question, **gen)  # type: ignore[arg-type]

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
        Evicted document text that matches the question comes back inside the turn
        (see follow_up.py).
        """
        if not self.can_follow_up:
            raise ConfigError("nothing to follow up: ask or summarize first")
        self.ctx.cancel_event.clear()
        self.reader.capture(True)  # a turn may evict
        return self.turns.turn(
            question,
            answer_prefix=answer_prefix,
            max_tokens=max_tokens,
            sampling=sampling or Sampling(),
            stops=stops,
        )

    def reask(
        self,
        tail: Sequence[int],
        question: str,
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] = (),
    ) -> Iterator[Event]:
        """Another question (``tail``, its tokens; ``question``, its text for recall)
        about the text the cache holds: after ``restore`` of a state saved at the
        "read" checkpoint, or ``rewind`` (see follow_up.py)."""
        if not self.cache.n_used:
            raise ConfigError("nothing read to ask about: restore or read a text first")
        self.ctx.cancel_event.clear()
        self.reader.capture(True)
        gen = {"max_tokens": max_tokens, "sampling": sampling or Sampling(), "stops": stops}
        return self.turns.reask(tail, question, **gen)

    def rewind(self, first_id: int) -> None:
        """Forget the tokens from id ``first_id`` on (a request's question and answer):
        the cache ends with the text read before them, ready for ``reask``."""
        self.reader.rewind(first_id)

    def run(
        self,
        prompt: Prompt,
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] | None = None,
        question: str = "",
    ) -> Iterator[Event]:
        """Fresh cache, read the prompt (evicting as needed), then generate. A cancel
        that comes while the prompt is tokenized (seconds for a long document) stops
        the run at its first step: the cancel event is cleared before, not after.
        ``question``: its text, for ``recall_first``."""
        self.ctx.cancel_event.clear()
        head, tail, sources = prompt_tokens(self.model, prompt)
        if not tail:
            raise ConfigError("the prompt's last part (the question) is empty")
        return self._run_tokens(
            head,
            tail,
            max_tokens=max_tokens,
            sampling=sampling,
            stops=stops if stops is not None else prompt.stops,
            sources=sources,
            question=question,
        )

    def run_tokens(
        self,
        head: Sequence[int],
        tail: Sequence[int],
        *,
        max_tokens: int = 128,
        sampling: Sampling | None = None,
        stops: Sequence[str] = (),
        sources: Sources | None = None,
        question: str = "",
    ) -> Iterator[Event]:
        """Fresh cache; read ``head`` (evicting as needed, with ``tail`` as the question
        that votes), then ``tail``, then generate. ``tail`` must not be empty.

        ``sources``: ``(name, text, tokens)`` whose tokens are ``head + tail`` in
        order, for the memory map; by default the two parts' own text. ``question``:
        the question's text, which brings back evicted text with ``recall_first``."""
        if not tail:
            raise ConfigError("the prompt's last part (the question) is empty")
        self.ctx.cancel_event.clear()
        gen = {"max_tokens": max_tokens, "sampling": sampling, "stops": stops}
        return self._run_tokens(head, tail, sources=sources, question=question, **gen)

    def _run_tokens(
        self,
        head: Sequence[int],
        tail: Sequence[int],
        *,
        max_tokens: int,
        sampling: Sampling | None,
        stops: Sequence[str],
        sources: Sources | None,
        question: str = "",
    ) -> Iterator[Event]:
        self.reset()
        r = self.reader
        n_tokens = len(head) + len(tail) + max_tokens
        # a job that fits whole never evicts: nothing to read, unless the policy keeps
        # every decode's (H2O's history, KeyDiff's keys would miss this read)
        r.capture(n_tokens > self.capacity or self.policy.needs().history)
        r.reserve(n_tokens, shrink=True)
        r.t0 = time.perf_counter()
        for name, text, tokens in sources or [("prompt", None, head), ("question", None, tail)]:
            if name == "document" and tokens:
                self.turns.document = (r.trace.n_ids, list(tokens))
            r.trace.add(name, text, tokens)
        gen = {"max_tokens": max_tokens, "sampling": sampling or Sampling(), "stops": tuple(stops)}
        keeps = r.sizing.keeps(n_tokens)  # nothing is evicted: the question votes on nothing
        at_once = keeps or r.sizing.reads_at_once(len(head) + len(tail), n_tokens, r.ctx)
        if r.checkpoint is None and at_once:  # one read (in a pool, a round less to wait
            # for); if the pool shrank the share before it ran, the question votes at the
            # eviction (without recall_first: it is read already)
            observe = () if keeps else tail
            yield from r.feed([*head, *tail], observe=observe, logits=True, whole=True)
            yield from self.generate(**gen)  # type: ignore[arg-type]
            return
        yield from r.feed(head, observe=tail, logits=False)
        if r.checkpoint is not None:  # the text is in, the question not yet
            r.checkpoint("read")
        if question and self.config.recall_first and r.cache.evicted:
            # what the read evicted that matches the question comes back, as in a follow-up
            yield from self.turns.reask(tail, question, restart_clock=False, **gen)
            return
        yield from r.feed(tail, logits=True)
        yield from self.generate(**gen)  # type: ignore[arg-type]

    def feed(
        self,
        tokens: Sequence[int],
        *,
        observe: Sequence[int] = (),
        logits: bool = True,
        every: bool = False,
    ) -> Iterator[Event]:
        """Append ``tokens`` in chunks, evicting as needed (see ``Reader.feed``)."""
        self.reader.capture(True)
        return self.reader.feed(tokens, observe=observe, logits=logits, every=every)

    def teacher_force(self, tokens: Sequence[int]) -> Iterator[np.ndarray]:
        """The logits of every position of ``tokens`` (see ``Reader.teacher_force``)."""
        self.reader.capture(True)
        return self.reader.teacher_force(tokens)

    def generate(
        self, *, max_tokens: int, sampling: Sampling, stops: tuple[str, ...] = ()
    ) -> Iterator[Event]:
        """Generate up to ``max_tokens`` tokens after what was fed (see generate.py)."""
        return generate(self.reader, max_tokens=max_tokens, sampling=sampling, stops=stops)

    def snapshot(self, extra: dict[str, Any] | None = None) -> SavedState:
        """The cache as it is now, to restore later (see state.py); ``extra``: the
        caller's JSON values, kept with it."""
        return state.snapshot(self, extra)

    def restore(self, saved: SavedState) -> None:
        """Continue from ``saved`` instead of reading again; ``StateError`` (with the
        reason) when it was made with another model, settings or version, or is
        damaged: the session is then empty."""
        state.restore(self, saved)

    def memory_map(self) -> MemoryMap:
        """What the cache holds now, mapped to the source text (see trace.py).

        O(tokens read): cheap enough to call between events of a long prefill.
        """
        return _memory_map(self)

    def close(self) -> None:
        self.ctx.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    collect = staticmethod(collect)


def _reader(model: Model, policy: Policy, config: SessionConfig, sizing: OwnContext) -> Reader:
    """The session's reader, in a context of its own or its pool share, with the cache
    settings decided once (``CacheSettings.decide``) for both."""
    max_position = config.max_position or model.info.n_ctx_train
    if sizing.n_ctx_max >= max_position:
        raise ConfigError(f"budget + chunk ({sizing.n_ctx_max}) must be below {max_position}")
    info = model.info
    wanted = policy.needs().cache(
        kv_type=config.kv_type,
        flash_attn=config.flash_attn,
        swa_cache=config.swa_cache,
        window_layers_unknown=info.n_swa > 0 and not info.n_swa_layers,
        who=policy.name,
    )
    room = config.chunk() if policy.evicts else sizing.n_ctx_max
    threads = config.n_threads or default_threads()
    ctx, cache = sizing.open(model, wanted, min(room, config.batch_tokens), threads)
    kv_type = config.kv_type
    if type_name(cache.type_v) != kv_type:
        kv_type = f"{kv_type}/{type_name(cache.type_v)}"  # K/V
    layout = info.kv_layout(cache.type_k, cache.type_v)
    return Reader(model, policy, config, sizing, ctx, layout, kv_type, cache)


def _check(model: Model, policy: Policy, config: SessionConfig) -> None:
    """Refuse sizes and policies that cannot work, in one line each."""
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
    if policy.needs().hooked and not model.info.global_layers:
        raise ConfigError(
            f"{policy.name} reads {policy.reads}, but kvtrim does not know which layers of "
            f"{model.info.arch} see the whole cache; use streaming or full"
        )


def _memory_map(session: Session) -> MemoryMap:
    """``Session.memory_map``: the sinks and the recent window as the policy keeps them."""
    session.reader.settle()  # the answer's last token is in the map, as in the cache
    held, policy = session.cache.ids, session.policy
    n_sink = min(policy.n_sink, len(held))
    recent = policy.recent_for(session.budget) if policy.evicts else 0
    if policy.recency_only:
        recent = len(held) - n_sink
    return session.trace.snapshot(
        held,
        session.cache.next_id,
        n_sink,
        min(recent, len(held) - n_sink),
        policy.name,
        session.budget,
        recalled=session.turns.recalled(),
    )
