"""What every policy shares: what it reads, what it keeps, what users may tune, and
the selection of what to keep.

A policy sees token *ids* (stream positions, in order) and declares what else it
reads from each decode (``reads``): attention rows over the held ids
(``Observation``), the keys of the tokens just decoded (``Keys``), or nothing.
Capture, flash attention and the cell map follow from that in one place
(``Needs``). Its ``score()`` says how much each held token is worth keeping;
``keep()`` always keeps the first ``n_sink`` tokens (attention sinks) and the last
``recent`` ones, and fills the rest of the budget by score. What it carries from
read to read is its ``state_dict()`` (saved caches store it); its parameters are
dataclass fields made with ``param()``, from which the command line, the server and
the app's settings panel are built. The engine alone turns the kept ids into KV calls.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from ..errors import ConfigError
from ..native.capture import Capture
from ..native.kvmemory import CacheSettings
from ..native.model import ModelInfo

Reads = Literal["attention", "keys", "nothing"]


@dataclass(frozen=True)
class Needs:
    """What a policy (or a pool of them) reads from each decode, and what follows:
    the eval callback (``hooked``), flash attention (off only where attention is
    read: llama.cpp's fused kernel never writes the probabilities), and a map of
    cells to positions (attention columns are cells; keys come in batch order)."""

    attention: bool = False
    keys: bool = False
    history: bool = False
    """Every decode must be observed (H2O sums every row; KeyDiff scores every key),
    not only those of a read that evicts."""

    @property
    def hooked(self) -> bool:
        return self.attention or self.keys

    @property
    def cell_map(self) -> bool:
        return self.attention

    def cache(self, **settings: Any) -> CacheSettings:
        """The cache settings (``CacheSettings.decide``'s keywords) for these needs."""
        return CacheSettings.decide(reads_attention=self.attention, **settings)

    def capture(self, info: ModelInfo) -> Capture | None:
        """What the eval callback reads for these needs (None: no callback), from the
        layers that see the whole cache."""
        if not self.hooked:
            return None
        if not info.global_layers:
            raise ConfigError(
                f"kvtrim does not know which layers of {info.arch} see the whole cache, so "
                "it reads neither their attention nor their keys; use streaming or full"
            )
        keys = (info.head_dim_k, info.n_head_kv) if self.keys else None
        return Capture(info.global_layers, keys)

    def __or__(self, other: Needs) -> Needs:
        return Needs(*(a or b for a, b in zip(self.flags(), other.flags(), strict=True)))

    def flags(self) -> tuple[bool, bool, bool]:
        return (self.attention, self.keys, self.history)


@dataclass(frozen=True)
class Param:
    """What users may set of a policy parameter: a label, one line of help and the
    range (inclusive)."""

    label: str
    help: str
    low: float
    high: float


def param(default: float, label: str, help: str, low: float, high: float) -> Any:
    """A policy's tunable field: ``window: int = param(32, "Window", "...", 1, 1024)``."""
    return dataclasses.field(default=default, metadata={"param": Param(label, help, low, high)})


def sinks(default: int) -> Any:
    """The ``n_sink`` field of a policy that lets users set it."""
    return param(default, "Sink tokens", "The first tokens, always kept: attention sinks.", 0, 4096)


def recent_window(default: int, help: str = "The newest tokens, always kept.") -> Any:
    """The ``recent`` field of a policy that lets users set it."""
    return param(default, "Recent window", help, 0, 131072)


@dataclass(frozen=True)
class Tunable:
    """One parameter of a policy class, as the CLI, the server and the app show it."""

    name: str
    kind: type
    default: float
    param: Param

    def describe(self) -> str:
        """``window 1..4,096 (32)``: the name, the range and the default."""
        low, high, default = (_number(x) for x in (self.param.low, self.param.high, self.default))
        return f"{self.name} {low}..{high} ({default})"

    def check(self, value: Any) -> float:
        """``value`` as the parameter's type, within range; ``ConfigError`` if not."""
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{self.name} must be a number, got {value!r}") from None
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise ConfigError(f"{self.name} must be a number, got {value!r}")
        if self.kind is int and value != int(value):
            raise ConfigError(f"{self.name} must be a whole number, got {value!r}")
        if not self.param.low <= value <= self.param.high:
            low, high = _number(self.param.low), _number(self.param.high)
            raise ConfigError(f"{self.name} must be in {low}..{high}, got {value:g}")
        return self.kind(value)  # type: ignore[no-any-return]


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


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
class Keys:
    """The keys of the tokens one decode wrote: ``ids`` int64 ``(n,)`` and ``vectors``
    float16 ``(n, layers, kv_heads, head_dim)``, each key scaled to unit length, of
    the observed (global) layers, after RoPE (as the cache holds them)."""

    ids: np.ndarray
    vectors: np.ndarray


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
    reads: ClassVar[Reads] = "attention"
    """What it reads from each decode: ``attention`` rows (``query_rows`` of them),
    ``keys`` of the tokens decoded, or ``nothing``."""
    evicts: ClassVar[bool] = True
    query_rows: ClassVar[int | None] = None
    """Trailing query rows of each decode to observe (None: all rows)."""
    recency_only: ClassVar[bool] = False
    """Whether the score is only recency (what it keeps beyond the sinks is a recent window)."""

    def __post_init__(self) -> None:
        if self.n_sink < 0 or self.recent < 0:
            raise ConfigError(f"{self.name}: n_sink and recent must be >= 0")
        for tunable in self.tunables():
            try:
                setattr(self, tunable.name, tunable.check(getattr(self, tunable.name)))
            except ConfigError as exc:
                raise ConfigError(f"{self.name}: {exc}") from None

    @classmethod
    def needs(cls) -> Needs:
        """What this policy reads, as the session and the pool set up capture."""
        attention, keys = cls.reads == "attention", cls.reads == "keys"
        history = keys or (attention and cls.query_rows is None)
        return Needs(attention=attention, keys=keys, history=history)

    @classmethod
    def tunables(cls) -> list[Tunable]:
        """The parameters users may set (fields made with ``param``), in field order."""
        out = []
        for f in dataclasses.fields(cls):
            found = f.metadata.get("param")
            if found is not None:
                kind = float if isinstance(f.default, float) else int
                out.append(Tunable(f.name, kind, f.default, found))  # type: ignore[arg-type]
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """What it carries from one read to the next (saved with a cache), as arrays;
        none by default."""
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:  # noqa: B027
        """Take back what ``state_dict`` gave (after ``reset``)."""

    def recent_for(self, budget: int) -> int:
        """How many of the newest tokens a budget of ``budget`` always keeps."""
        return self.recent

    def protected(self, budget: int) -> int:
        """Tokens kept whatever they score."""
        return self.n_sink + self.recent_for(budget)

    def observe(self, obs: Observation | Keys) -> None:  # noqa: B027 - optional hook
        """Called after every decode with what ``reads`` asked for: the rows
        ``query_rows`` asked for, or the keys of the tokens decoded."""

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
