"""Eviction policies, one per file; ``make_policy`` builds one by name."""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import Observation, Policy
from .full import Full
from .h2o import H2O
from .snapkv import SnapKV
from .streaming import StreamingLLM
from .tova import TOVA

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Full, StreamingLLM, H2O, SnapKV, TOVA)
}


def make_policy(name: str, **settings: Any) -> Policy:
    """A policy by name (``full``, ``streaming``, ``h2o``, ``snapkv``, ``tova``)."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
    return cls(**settings)


__all__ = [
    "H2O",
    "POLICIES",
    "TOVA",
    "Full",
    "Observation",
    "Policy",
    "SnapKV",
    "StreamingLLM",
    "make_policy",
]
