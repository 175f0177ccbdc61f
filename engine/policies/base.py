"""What every policy shares: what it observes, and the selection of what to keep.

A policy sees token *ids* (stream positions, in order) and, if it asks for
them, attention rows over those ids. Its ``score()`` says how much each held
token is worth keeping; ``keep()`` always keeps the first ``n_sink`` tokens
(attention sinks) and the last ``recent`` ones, and fills the rest of the
budget by score. The engine alone turns the kept ids into KV calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Observation:
    """Attention of some query rows over the held tokens.

    ``ids``: int64 ``(n,)``, the held tokens' ids in order. ``attn``: float32
    ``(rows, n)``, attention probability of each query row on each held token,
    averaged over heads and over the observed (global) layers.
    """

    ids: np.ndarray
    attn: np.ndarray


@dataclass(frozen=True)
class KeepSet:
    """What ``Policy.keep`` chose: the kept ``ids`` (in id order) and, when it scored,
    the ``scores`` it gave each held id (``scored``), for the memory map."""

    ids: np.ndarray
    scored: np.ndarray | None = None
    scores: np.ndarray | None = None


def realign(values: np.ndarray, src_ids: np.ndarray, dst_ids: np.ndarray) -> np.ndarray:
    """Re-index the last axis of ``values`` from ``src_ids`` to ``dst_ids`` (absent: 0)."""
    out = np.zeros((*values.shape[:-1], len(dst_ids)), dtype=values.dtype)
    if len(src_ids) == 0 or len(dst_ids) == 0:
        return out
    idx = np.clip(np.searchsorted(src_ids, dst_ids), 0, len(src_ids) - 1)
    found = src_ids[idx] == dst_ids
    out[..., found] = values[..., idx[found]]
    return out


def max_pool(scores: np.ndarray, kernel: int) -> np.ndarray:
    """Max over ``kernel`` neighbours in id order (SnapKV's pooling; 1 is none)."""
    if kernel <= 1 or len(scores) == 0:
        return scores
    half = kernel // 2
    padded = np.pad(scores, (half, kernel - 1 - half), mode="edge")
    return np.lib.stride_tricks.sliding_window_view(padded, kernel).max(axis=1)


def word_max(scores: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Every token takes the best score of its word (``words``: one label per token).

    kvtrim's addition to the papers' per-token scores: the model writes a number one
    digit per token, and pooling over a fixed neighbourhood can keep "2005" of
    "20057" (measured: a 16K-token document, SnapKV at budget 1,024 answered 2005).
    """
    if len(scores) == 0:
        return scores
    _, inverse = np.unique(words, return_inverse=True)
    best = np.full(int(inverse.max()) + 1, -np.inf)
    np.maximum.at(best, inverse, scores)
    return best[inverse]


@dataclass
class Policy(ABC):
    """Base of every eviction policy: ``n_sink`` + ``recent`` always kept."""

    n_sink: int = 4
    recent: int = 32

    name: ClassVar[str] = "policy"
    """The policy's name on the command line, in the API and in results."""
    label: ClassVar[str] = "Policy"
    """Its display name (settings panel, status line, reports)."""
    help: ClassVar[str] = ""
    """One line: what it keeps, and the paper it comes from."""
    needs_attention: ClassVar[bool] = True
    evicts: ClassVar[bool] = True
    query_rows: ClassVar[int | None] = None
    """Trailing query rows of each decode to observe (None: all rows)."""
    recency_only: ClassVar[bool] = False
    """Whether the score is only recency (what it keeps beyond the sinks is a recent window)."""

    def __post_init__(self) -> None:
        if self.n_sink < 0 or self.recent < 0:
            raise ConfigError(f"{self.name}: n_sink and recent must be >= 0")

    def recent_for(self, budget: int) -> int:
        """How many of the newest tokens a budget of ``budget`` always keeps."""
        return self.recent

    def protected(self, budget: int) -> int:
        """Tokens kept whatever they score."""
        return self.n_sink + self.recent_for(budget)

    def observe(self, obs: Observation) -> None:  # noqa: B027 - optional hook
        """Called after every decode with the rows ``query_rows`` asked for."""

    def reset(self) -> None:  # noqa: B027 - optional hook
        """Forget everything observed (a new conversation)."""

    @abstractmethod
    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        """Worth of keeping each of ``ids`` (higher is kept first).

        ``query`` is the attention of a known question's tokens when the
        engine runs question-aware, else None.
        """

    def keep(
        self,
        ids: np.ndarray,
        budget: int,
        query: Observation | None = None,
        words: np.ndarray | None = None,
    ) -> KeepSet:
        """The ids to keep: at most ``budget`` of ``ids``, with the scores that chose
        them. ``words`` (the word each held token belongs to, see ``word_max``) makes
        words kept or evicted whole."""
        n = len(ids)
        if n <= budget:
            return KeepSet(ids)
        recent = self.recent_for(budget)
        if budget < self.n_sink + recent:
            raise ConfigError(
                f"budget {budget} cannot hold {self.n_sink} sink and {recent} recent tokens"
            )
        must = np.zeros(n, dtype=bool)
        must[: self.n_sink] = True
        if recent:
            must[n - recent :] = True
        free = budget - int(must.sum())
        scores = np.asarray(self.score(ids, query), dtype=np.float64)
        if words is not None and not self.recency_only:
            scores = word_max(scores, words)
        candidates = np.flatnonzero(~must)
        # stable sort on -score: among equal scores the later token wins
        order = np.argsort(-scores[candidates][::-1], kind="stable")
        chosen = candidates[::-1][order[:free]]
        must[chosen] = True
        return KeepSet(ids[must], ids, scores)
