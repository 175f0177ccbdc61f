"""Figures a run reports, and the events a session emits while it works.

Units are in the names: ``*_bytes`` in bytes, ``*_s`` in seconds, ``*_per_s``
in tokens per second; cells and tokens are counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .native.kvmemory import KVLayout


@dataclass
class KVStats:
    """The state of a session's cache and its running totals.

    KV bytes come in three figures (see kvmemory.py): ``kv_bytes`` held by this
    session, ``kv_bytes_llama_default`` that llama.cpp's default context would
    allocate for the same tokens, ``kv_bytes_full`` for a cell per token in every
    layer. ``n_ctx`` is the global layers' cells, ``swa_cells`` the sliding-window
    layers' (0 without such layers).
    """

    policy: str
    budget_tokens: int
    n_ctx: int
    kv_bytes_per_cell: int  # over every layer
    kv_bytes_per_cell_swa: int = 0  # the sliding-window layers' share of it
    n_swa: int = 0
    swa_cells: int = 0
    kv_type: str = "f16"
    cells_used: int = 0
    cells_peak: int = 0
    tokens_seen: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    evicted_tokens: int = 0
    evictions: int = 0
    compactions: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    capture_s: float = 0.0
    score_s: float = 0.0
    first_token_s: float | None = None
    recalled_tokens: int = 0  # document tokens re-decoded for the latest follow-up
    cached_tokens: int = 0  # prompt tokens not read again: a saved or kept read reused
    recall_host_bytes: int = 0  # host RAM of the recall index (document ids, BM25)
    reads: int = 1  # fresh reads behind these figures (a summary reads part by part)

    @property
    def layout(self) -> KVLayout:
        swa = self.kv_bytes_per_cell_swa
        return KVLayout(self.kv_bytes_per_cell - swa, swa, self.n_swa)

    @property
    def kv_bytes(self) -> int:
        """KV memory the session holds: its allocated caches (global and SWA layers)."""
        return self.layout.allocated(self.n_ctx, self.swa_cells)

    @property
    def kv_bytes_llama_default(self) -> int:
        """What llama.cpp's default context would allocate for every token seen
        (sliding-window layers at window + batch cells), same model and KV types."""
        return self.layout.llama_default(self.tokens_seen)

    @property
    def kv_bytes_full(self) -> int:
        """A cell for every token seen in every layer (llama-cpp-python's ``swa_full``)."""
        return self.layout.full(self.tokens_seen)

    @property
    def kv_ratio(self) -> float:
        """KV memory held / llama.cpp's default for the same tokens (0 before any)."""
        base = self.kv_bytes_llama_default
        return self.kv_bytes / base if base else 0.0

    @property
    def kv_ratio_full(self) -> float:
        """KV memory held / a full cache in every layer (0 before any token)."""
        return self.kv_bytes / self.kv_bytes_full if self.kv_bytes_full else 0.0

    @property
    def kv_bytes_used(self) -> int:
        """KV memory of the cells in use now (SWA layers: at most their cache)."""
        return self.layout.allocated(self.cells_used, min(self.cells_used, self.swa_cells))

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in (
            "kv_bytes",
            "kv_bytes_llama_default",
            "kv_bytes_full",
            "kv_bytes_used",
            "kv_ratio",
            "kv_ratio_full",
            "prefill_tokens_per_s",
            "decode_tokens_per_s",
        ):
            d[name] = getattr(self, name)
        return d


@dataclass(frozen=True)
class Progress:
    """A chunk of the prompt was read: ``done`` of ``total`` tokens."""

    done: int
    total: int
    stats: KVStats


@dataclass(frozen=True)
class Evicted:
    """The cache was trimmed to ``kept`` tokens, ``removed`` were evicted."""

    kept: int
    removed: int
    stats: KVStats


@dataclass(frozen=True)
class Recalled:
    """A follow-up brought back ``excerpts`` of the document (their text), ``tokens``
    tokens in all, re-decoded before the question (see recall.py)."""

    excerpts: tuple[str, ...]
    tokens: int
    stats: KVStats


@dataclass(frozen=True)
class Restored:
    """A saved cache came back instead of a read (session/state.py): ``tokens`` held
    of ``seen`` read when it was saved, in ``seconds``; or, with ``reason``, it could
    not be used and the text is read again."""

    tokens: int
    seen: int
    seconds: float
    stats: KVStats
    reason: str = ""


@dataclass(frozen=True)
class Token:
    """One generated token and the text it completed (may be empty mid-character)."""

    token: int
    text: str
    stats: KVStats


@dataclass(frozen=True)
class Done:
    """Generation ended: ``reason`` is ``stop``, ``length``, ``eog`` or ``repetition``
    (the answer fell into a loop: ``sampling.LoopGuard``)."""

    text: str
    reason: str
    stats: KVStats


Event = Progress | Evicted | Recalled | Restored | Token | Done


@dataclass
class Result:
    """The outcome of ``ask``/``summarize``: the answer and the final figures."""

    text: str
    reason: str
    stats: KVStats
    model: str
    events: int = 0
