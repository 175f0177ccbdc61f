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

    def spy(tokens: Sequence[int], **kw: Any) -> None:
        fed.extend(tokens)
        decode(tokens, **kw)

    s.reader.decode = spy  # type: ignore[method-assign]
    return fed
