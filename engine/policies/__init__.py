"""Eviction policies, one per file; ``make_policy`` builds one by name.

Each class carries what the rest of kvtrim says about it: ``name``, ``label``,
``help``, and whether it ``evicts`` and ``needs_attention``; callers look these
up with ``policy_class(name)`` instead of comparing names.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .base import KeepSet, Observation, Policy
from .full import Full
from .h2o import H2O
from .snapkv import SnapKV
from .streaming import StreamingLLM
from .tova import TOVA

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Full, StreamingLLM, H2O, SnapKV, TOVA)
}


def policy_class(name: str) -> type[Policy]:
    """The class of the policy called ``name``; ``ConfigError`` if there is none."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def make_policy(name: str, **settings: Any) -> Policy:
    """A policy by name (``full``, ``streaming``, ``h2o``, ``snapkv``, ``tova``)."""
    return policy_class(name)(**settings)


def evicts(name: str) -> bool:
    """Whether the policy called ``name`` evicts (False for ``full`` and for a name
    that is no policy, as in results written by an older kvtrim)."""
    cls = POLICIES.get(name)
    return cls is not None and cls.evicts


def keeps_all(name: str) -> bool:
    """Whether ``name`` is a policy that never evicts (the full-cache reference);
    False for a name that is no policy (a llama-cpp-python row of a report)."""
    cls = POLICIES.get(name)
    return cls is not None and not cls.evicts


def reads_attention(name: str) -> bool:
    """Whether the policy called ``name`` scores with attention (False when unknown)."""
    cls = POLICIES.get(name)
    return cls is not None and cls.needs_attention


def label(name: str) -> str:
    """The display name of the policy called ``name`` (the name itself when unknown)."""
    cls = POLICIES.get(name)
    return cls.label if cls is not None else name


def help_lines() -> str:
    """``name: help`` for every policy, one sentence each (for ``--policy``'s help)."""
    return " ".join(f"{name}: {cls.help}" for name, cls in POLICIES.items())


__all__ = [
    "H2O",
    "POLICIES",
    "TOVA",
    "Full",
    "KeepSet",
    "Observation",
    "Policy",
    "SnapKV",
    "StreamingLLM",
    "evicts",
    "help_lines",
    "keeps_all",
    "label",
    "make_policy",
    "policy_class",
    "reads_attention",
]
