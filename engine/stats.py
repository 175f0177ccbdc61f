"""Figures a run reports, and the events a session emits while it works.

Units are in the names: ``*_bytes`` in bytes, ``*_s`` in seconds, ``*_per_s``
in tokens per second; cells and tokens are counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class KVStats:
    """The state of a session's cache and its running totals."""

    policy: str
    budget_tokens: int
    n_ctx: int
    kv_bytes_per_cell: int
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

    @property
    def kv_bytes(self) -> int:
        """KV memory the session holds: the allocated cache of ``n_ctx`` cells."""
        return self.n_ctx * self.kv_bytes_per_cell

    @property
    def kv_bytes_full(self) -> int:
        """What a full cache for every token seen would hold, same model and KV type."""
        return self.tokens_seen * self.kv_bytes_per_cell

    @property
    def kv_ratio(self) -> float:
        """KV memory held / what a full cache would hold (0 before any token)."""
        return self.kv_bytes / self.kv_bytes_full if self.kv_bytes_full else 0.0

    @property
    def kv_bytes_used(self) -> int:
        """KV memory of the cells in use now."""
        return self.cells_used * self.kv_bytes_per_cell

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
            "kv_bytes_full",
            "kv_bytes_used",
            "kv_ratio",
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
class Token:
    """One generated token and the text it completed (may be empty mid-character)."""

    token: int
    text: str
    stats: KVStats


@dataclass(frozen=True)
class Done:
    """Generation ended: ``reason`` is ``stop``, ``length`` or ``eog``."""

    text: str
    reason: str
    stats: KVStats


Event = Progress | Evicted | Token | Done


@dataclass
class Result:
    """The outcome of ``ask``/``summarize``: the answer and the final figures."""

    text: str
    reason: str
    stats: KVStats
    model: str
    events: int = 0
