"""A session's settings: sizes in tokens (= KV cells), how positions are renumbered
after an eviction, and the cache types. Checked once, when the config is made."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError
from ..native.kvmemory import KV_TYPES, SWA_CACHES
from .recall import WINDOW_TOKENS as RECALL_WINDOW
from .sizing import MIN_CHUNK

MAX_BATCH = 512  # tokens per llama_decode (llama.cpp's default micro-batch)
POSITION_MODES = ("auto", "compact", "original", "bounded")
"""After an eviction, ``compact`` renumbers the kept tokens 0..n-1 (``seq_shift``),
as StreamingLLM and llama.cpp's context shift do; ``original`` keeps the
positions the tokens were read at (the H2O/SnapKV papers); ``bounded`` shortens
each hole an eviction leaves to at most ``BOUNDED_GAP`` positions, so distances
stay ordered but small; ``auto`` (the default) is compact while the sequence's
text is at most ``AUTO_SPAN`` budgets long and bounded beyond. Each compacts
fully before a position would pass the trained context."""
AUTO_SPAN = 16
"""``auto``'s switch, in budgets of text read (docs/benchmarks/history.md, "Positions by default"):
compact found more at 2K-9K tokens (needle bars: 15 of 24 real-text keys against 11;
H2O's README demo), bounded at 30K-64K (RULER: 12 of 15 against 10, and the 30K
release-notes answer), even at 16K-32K."""
BOUNDED_GAP = 64  # positions a hole keeps in ``bounded`` mode (positions_probe.py: 16 and 64)


@dataclass(frozen=True)
class SessionOptions:
    """The session settings one request chooses, declared once: ``RequestSpec``
    (every request's settings) and ``SessionConfig`` (a session's, with the engine's
    threads and batch) both extend this class, so a new option is one field here
    plus where it is exposed (a command-line flag whose ``dest`` is the field's name,
    the server, the app). Sizes in tokens (= KV cells).

    ``chunk_tokens``: tokens read between evictions (None: budget / 4).
    ``positions``: see ``POSITION_MODES`` (``auto`` by default: see ``AUTO_SPAN``);
    ``position_gap``: the longest hole ``bounded`` leaves, in positions.
    ``kv_type``: K cache type, and V's too where flash attention runs (policies
    that read no attention);
    ``swa_cache``: see ``kvmemory.SWA_CACHES`` (the budget bounds the global layers,
    sliding-window layers keep window + batch cells or a cell per held token); None:
    the engine's default. ``whole_words``: a word (a number's digits) is kept or
    evicted whole (see ``policies.base.word_max``). ``recall_tokens``: how many
    evicted document tokens a follow-up may bring back (see follow_up.py); None: a
    chunk, 0: none. ``recall_first``: the first question about a text brings back
    the evicted windows that best match it too, as a follow-up does (a question with
    its text: ``Session.ask``, ``kvtrim ask``, the server's chat).
    """

    budget_tokens: int = 1024
    chunk_tokens: int | None = None
    question_aware: bool = True
    positions: str = "auto"
    position_gap: int = BOUNDED_GAP
    flash_attn: str = "auto"
    kv_type: str | None = None
    swa_cache: str | None = None
    whole_words: bool = True
    recall_tokens: int | None = None
    recall_first: bool = True
    """On by default since issue 34's fidelity run: at 8 budgets of text, first answers
    right 30% without and 95% with it on Gemma 3 270M (73 items, +64 points,
    Newcombe 95% +51..+74), 0% and 100% on SmolLM2-135M (10 items so far); the value
    was evicted in 36 of the 52 misses without it (BENCHMARKS.md, "Fidelity")."""

    def __post_init__(self) -> None:
        if isinstance(self.budget_tokens, bool) or not isinstance(self.budget_tokens, int):
            raise ConfigError(
                f"budget_tokens must be a number of tokens, got {self.budget_tokens!r}"
            )
        if self.swa_cache is not None and self.swa_cache not in SWA_CACHES:
            raise ConfigError(f"swa_cache must be one of {', '.join(SWA_CACHES)}")
        if self.kv_type is not None and self.kv_type not in KV_TYPES:
            raise ConfigError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise ConfigError("flash_attn must be auto, on or off")
        if self.positions not in POSITION_MODES:
            raise ConfigError(f"positions must be one of {', '.join(POSITION_MODES)}")
        if self.recall_tokens is not None and self.recall_tokens < 0:
            raise ConfigError("recall_tokens must be >= 0")
        if self.position_gap < 1:
            raise ConfigError(f"position_gap must be >= 1, got {self.position_gap}")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names (``SessionOptions``' fields, not a subclass's)."""
        return tuple(f.name for f in fields(SessionOptions))

    def options(self) -> dict[str, Any]:
        """The options as keyword arguments (of ``SessionConfig``, ``Engine.session``)."""
        return {name: getattr(self, name) for name in self.names()}

    def chunk(self) -> int:
        return self.chunk_tokens or max(MIN_CHUNK * 4, self.budget_tokens // 4)

    def recall(self) -> int:
        """Document tokens a follow-up may bring back (see recall.py); default: a chunk,
        at least two windows."""
        if self.recall_tokens is not None:
            return self.recall_tokens
        return max(self.chunk(), 2 * RECALL_WINDOW)

    def hole(self, read: int = 0, budget: int | None = None) -> int | None:
        """The longest hole an eviction may leave in the positions: 0 (compact),
        ``position_gap`` (bounded), or None (original: holes stay); ``auto`` decides
        by ``read``, the tokens of text the sequence reads, against ``budget`` tokens
        (the session's; default ``budget_tokens``)."""
        mode = self.positions
        if mode == "auto":
            span = AUTO_SPAN * (budget or self.budget_tokens)
            mode = "bounded" if read > span else "compact"
        return {"compact": 0, "bounded": self.position_gap}.get(mode)


@dataclass(frozen=True)
class SessionConfig(SessionOptions):
    """A session's settings: the request's (``SessionOptions``) with the cache types
    resolved, and the engine's threads (None: the physical cores), tokens per
    ``llama_decode`` and highest position (None: the model's trained context)."""

    kv_type: str = "f16"
    swa_cache: str = "window"
    max_position: int | None = None
    n_threads: int | None = None
    batch_tokens: int = MAX_BATCH

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.batch_tokens <= 65536:
            raise ConfigError(f"batch must be 1..65536 tokens, got {self.batch_tokens}")


def usable_cpus() -> int:
    """Logical CPUs this process may run on (its affinity: ``taskset``, a container's
    cpuset), not all the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """llama.cpp's threads when none are asked for: the physical cores, but never more
    than the CPUs this process may run on (its threads spin while they wait, so two on
    one CPU make every decode many times slower)."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:  # pragma: no cover
        cores = os.cpu_count() or 1
    return max(1, min(cores, usable_cpus()))
