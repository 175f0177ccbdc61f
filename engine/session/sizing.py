"""How many KV cells a session may use: its own context's, which grows with the text
up to ``budget + chunk`` (``OwnContext``), or a pool's share, which the pool changes as
requests come and go (``PoolShare``). Sizes in cells (= tokens)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..kv.context import PooledSequence, SequenceContext
from ..native.context import NativeContext
from ..native.kvmemory import CacheSettings, pad
from ..native.model import Model
from ..policies import Policy
from ..stats import KVStats

MIN_CHUNK = 16  # tokens: the smallest chunk, and the room a pooled eviction leaves to read


@dataclass
class OwnContext:
    """A lone session: ``capacity`` = budget + chunk for a policy that evicts (the
    budget alone for one that never does), ``n_ctx_max`` that rounded up to 256 as
    llama.cpp does. Not used as extra chunk room: a chunk close to the budget evicts
    too coarsely (measured: SnapKV at budget 256 found 3/4 real-text keys with 64-token
    chunks, 1/4 with 256)."""

    policy: Policy
    budget_tokens: int
    chunk_tokens: int

    grows = True  # the context is resized as the text comes (Reader.reserve)
    follows_share = False

    def open(
        self, model: Model, cache: CacheSettings, n_batch: int, n_threads: int
    ) -> tuple[SequenceContext, CacheSettings]:
        """The context to decode in, and the cache settings it was made with: a
        context of its own, as small as a batch (it grows with the text, up to
        ``n_ctx_max``: a short document never holds more cells than llama.cpp would
        give it)."""
        capture = self.policy.needs().capture(model.info)
        ctx = NativeContext(
            model,
            n_ctx=min(self.n_ctx_max, pad(n_batch)),
            n_batch=n_batch,
            n_threads=n_threads,
            capture=capture,
            flash_attn=cache.flash_alone(),
            swa_full=cache.swa_full,
            type_k=cache.type_k,
            type_v=cache.type_v,
        )
        return ctx, cache

    @property
    def capacity(self) -> int:
        """Cells the text may fill before the policy evicts."""
        evicts = self.policy.evicts
        return self.budget_tokens + self.chunk_tokens if evicts else self.budget_tokens

    def keeps(self, n_tokens: int) -> bool:
        """Whether a job of ``n_tokens`` (prompt and answer) fits whole and keeps its
        cells to the end: it is then read without evicting anything."""
        return n_tokens <= self.capacity

    def reads_at_once(self, n_read: int, n_tokens: int, ctx: SequenceContext) -> bool:
        """Whether a prompt of ``n_read`` tokens (``n_tokens`` with its answer) fits the
        cells held now in one decode of ``ctx``: a job ``keeps`` may not vouch for (a
        pool may shrink its share later) is then still read in one decode, not its
        text and then its question (a round less in a pool; one ubatch, not a small
        one after)."""
        return n_tokens <= self.capacity and n_read <= ctx.n_batch

    @property
    def n_ctx_max(self) -> int:
        """Cells this session may ever hold (the question's scratch included)."""
        return pad(self.capacity)

    @property
    def budget(self) -> int:
        """Tokens the policy keeps at an eviction."""
        return self.budget_tokens

    def limits(self, reserve: int) -> tuple[int, int]:
        """Cells the text may fill with a ``reserve``-token question beside it (the
        question only needs physical cells), and how many an eviction keeps."""
        return min(self.capacity, self.n_ctx_max - reserve), self.budget

    def reading(self, reserve: int) -> None:
        """Reading begins with a ``reserve``-token question (a pool share is told)."""

    def report(self, stats: KVStats) -> None:
        """The session's figures changed (a pool publishes them for ``/metrics``)."""


@dataclass
class PoolShare(OwnContext):
    """One sequence of a ``KVPool``: at most its ``slot``'s share, which the pool
    lowers when others come and raises when they go. The budget follows the share
    (beside a chunk and the question's room, at least the policy's protected tokens
    and a few to choose)."""

    slot: PooledSequence | None = None

    grows = False  # a pool's share is fixed when the sequence is admitted
    follows_share = True  # limits are read again before every chunk

    def open(
        self, model: Model, cache: CacheSettings, n_batch: int, n_threads: int
    ) -> tuple[SequenceContext, CacheSettings]:
        """The slot, with the pool's cache settings: a request whose own settings the
        pool cannot honour is refused, never silently changed."""
        assert self.slot is not None
        why = self.slot.cache_settings.refusal(cache)
        if why is not None:
            raise ConfigError(f"this request cannot run in the shared KV pool: {why}")
        return self.slot, self.slot.cache_settings

    def _share(self) -> int:
        assert self.slot is not None
        return self.slot.n_ctx

    @property
    def n_ctx_max(self) -> int:
        return self._share()

    @property
    def capacity(self) -> int:
        return min(super().capacity, self._share())  # the question's cells: see limits

    def keeps(self, n_tokens: int) -> bool:
        """As a lone session's, and the pool cannot shrink the share under the job
        when others come (``PooledSequence.floor``)."""
        assert self.slot is not None
        return super().keeps(n_tokens) and n_tokens <= self.slot.floor

    @property
    def budget(self) -> int:
        if not self.policy.evicts:
            return self.budget_tokens
        floor = min(self.budget_tokens, self.policy.protected(self.budget_tokens) + MIN_CHUNK)
        return max(floor, min(self.budget_tokens, self.capacity - self.chunk_tokens))

    def limits(self, reserve: int) -> tuple[int, int]:
        """As a lone session's, but in a share that shrank under a long question an
        eviction keeps what leaves room for a few tokens to be read."""
        limit = min(self.capacity, self.n_ctx_max - reserve)
        if not self.policy.evicts:
            return limit, self.budget
        floor = self.policy.protected(self.budget_tokens) + 1
        return limit, max(floor, min(self.budget, limit - MIN_CHUNK))

    def reading(self, reserve: int) -> None:
        """The pool must not shrink this share below what reading on needs."""
        assert self.slot is not None
        if self.policy.evicts:
            protected = self.policy.protected(self.budget_tokens) + 1
            self.slot.least = reserve + protected + MIN_CHUNK

    def report(self, stats: KVStats) -> None:
        assert self.slot is not None
        self.slot.stats = stats
