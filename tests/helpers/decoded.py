"""What a session decodes into its cache, recorded as it happens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine import Session


def record_decodes(s: Session) -> list[int]:
    """Every token ``s`` decodes into its cache from now on, in order (prompt, document,
    turns and generated answers all go through ``Reader.decode``)."""
    fed: list[int] = []
    decode = s.reader.decode

    def spy(tokens: Sequence[int], **kw: Any) -> int | None:
        fed.extend(tokens)
        return decode(tokens, **kw)

    s.reader.decode = spy  # type: ignore[method-assign]
    return fed


def record_decodes_by_id(s: Session) -> dict[int, int]:
    """Every token ``s`` decodes from now on, by its id in the cache (an answer's token
    dropped before it was decoded, a stop's, spends an id that never appears)."""
    fed: dict[int, int] = {}
    decode = s.reader.decode

    def spy(tokens: Sequence[int], **kw: Any) -> int | None:
        first = s.reader.cache.next_id if s.reader.pending is None else s.reader.cache.next_id + 1
        fed.update(zip(range(first, first + len(tokens)), tokens, strict=True))
        return decode(tokens, **kw)

    s.reader.decode = spy  # type: ignore[method-assign]
    return fed
