"""What each chat's saved cache means for the user: its size on disk (in the status
line), and a settings change that cannot reuse it, said before the next message
re-reads (a note with the time a re-read takes and a button to keep the old
settings). Sizes in bytes, rates in tokens per second."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.policies import label as policy_label
from engine.stats import KVStats

DEFAULT_RATE = 300.0  # tokens/s read before any was measured (2 CPU cores, 270M model)


@dataclass
class _Made:
    """The settings a chat's cache was made with, and what re-reading it costs."""

    key: tuple[Any, ...]
    policy: str
    budget: int
    tokens: int  # tokens read into it, all turns
    rate: float  # tokens/s of its reading


@dataclass
class SavedCaches:
    """Per chat id: bytes on disk and the settings of its cache."""

    sizes: dict[int, int] = field(default_factory=dict)
    made: dict[int, _Made] = field(default_factory=dict)

    def answered(self, chat: int, key: tuple[Any, ...], stats: KVStats) -> None:
        """A chat's answer came with ``stats``, its cache made with settings ``key``."""
        seen = self.made.get(chat)
        rate = stats.prefill_tokens_per_s if stats.prefill_s > 0.5 else 0.0
        rate = rate or (seen.rate if seen else DEFAULT_RATE)
        self.made[chat] = _Made(key, stats.policy, stats.budget_tokens, stats.tokens_seen, rate)

    def saved(self, chat: int, size: int) -> None:
        self.sizes[chat] = size

    def forget(self, chat: int) -> None:
        self.sizes.pop(chat, None)
        self.made.pop(chat, None)

    def status(self, chat: int | None) -> str:
        """The status line's part for the shown chat ("" when nothing is saved)."""
        size = self.sizes.get(chat, 0) if chat is not None else 0
        return f"this chat's cache saved: {size / 2**20:.1f} MB" if size else ""

    def switch_note(self, chat: int | None, key: tuple[Any, ...]) -> str | None:
        """What changing to settings ``key`` costs the shown chat, or None (nothing
        held, or the same settings)."""
        made = self.made.get(chat) if chat is not None else None
        if made is None or made.key == key:
            return None
        seconds = made.tokens / max(made.rate, 1.0)
        return (
            f"Switching re-reads this chat's document and conversation on the next message "
            f"(about {seconds:.0f} s for {made.tokens:,} tokens): its saved cache was made "
            f"with {policy_label(made.policy)} at a {made.budget:,}-token budget."
        )
