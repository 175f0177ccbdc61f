"""Eviction policies, one per file; ``make_policy`` builds one by name.

Each class carries what the rest of kvtrim says about it: ``name``, ``label``,
``help``, whether it ``evicts``, what it ``reads`` (``needs()``) and its tunable
parameters (``tunables()``); callers look these up with ``policy_class(name)``
instead of comparing names. Adding a policy: docs/design.md, "Adding a policy".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .base import KeepSet, Keys, Needs, Observation, Policy, Tunable
from .full import Full
from .h2o import H2O
from .keydiff import KeyDiff
from .snapkv import SnapKV
from .streaming import StreamingLLM
from .tova import TOVA

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Full, StreamingLLM, H2O, SnapKV, TOVA, KeyDiff)
}


DEFAULT = "snapkv"
"""The policy every request, the server and the app use unless told otherwise."""


def policy_class(name: str) -> type[Policy]:
    """The class of the policy called ``name``; ``ConfigError`` if there is none."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def make_policy(name: str, **settings: Any) -> Policy:
    """A policy by name (see ``POLICIES``) with its parameters (``Policy.tunables``)."""
    return policy_class(name)(**settings)


def parse_settings(
    name: str, given: Mapping[str, Any] | Sequence[str]
) -> tuple[tuple[str, Any], ...]:
    """The parameters of the policy ``name`` from ``NAME=VALUE`` strings (the command
    line's ``--policy-arg``) or a mapping (a request's ``kv_policy_args``), each
    checked against its range, sorted by name; ``ConfigError`` names a bad one and
    what the policy takes."""
    tunables = {t.name: t for t in policy_class(name).tunables()}
    pairs: list[tuple[str, Any]] = []
    if isinstance(given, Mapping):
        pairs = list(given.items())
    else:
        for text in given:
            key, sep, value = text.partition("=")
            if not sep:
                raise ConfigError(f"policy argument {text!r}: write NAME=VALUE")
            pairs.append((key.strip(), value.strip()))
    out = {}
    for key, value in pairs:
        if key not in tunables:
            takes = ", ".join(tunables) or "no parameters"
            raise ConfigError(f"{name} has no parameter {key!r}; it takes {takes}")
        try:
            out[key] = tunables[key].check(value)
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    make_policy(name, **out)  # what one range cannot say (SnapKV's odd kernel) fails here
    return tuple(sorted(out.items()))


def evicts(name: str) -> bool:
    """Whether the policy called ``name`` evicts (False for ``full`` and for a name
    that is no policy, as in results written by an older kvtrim)."""
    cls = POLICIES.get(name)
    return cls is not None and cls.evicts


def evicting() -> list[str]:
    """Every policy that evicts, in ``POLICIES``' order: what a benchmark compares."""
    return [name for name, cls in POLICIES.items() if cls.evicts]


def keeps_all(name: str) -> bool:
    """Whether ``name`` is a policy that never evicts (the full-cache reference);
    False for a name that is no policy (a llama-cpp-python row of a report)."""
    cls = POLICIES.get(name)
    return cls is not None and not cls.evicts


def reads_attention(name: str) -> bool:
    """Whether the policy called ``name`` scores with attention (False when unknown)."""
    cls = POLICIES.get(name)
    return cls is not None and cls.needs().attention


ATTENTION = Needs(attention=True)
"""What a pool reads by default: attention (every attention policy's rows)."""


def needs_of(names: list[str] | None = None) -> Needs:
    """What a pool must read to run any of the policies ``names`` (default: all)."""
    out = Needs()
    for name in names if names is not None else list(POLICIES):
        out = out | policy_class(name).needs()
    return out


def label(name: str) -> str:
    """The display name of the policy called ``name`` (the name itself when unknown)."""
    cls = POLICIES.get(name)
    return cls.label if cls is not None else name


def help_lines() -> str:
    """``name: help`` for every policy, one sentence each (for ``--policy``'s help)."""
    return " ".join(f"{name}: {cls.help}" for name, cls in POLICIES.items())


__all__ = [
    "ATTENTION",
    "DEFAULT",
    "H2O",
    "POLICIES",
    "TOVA",
    "Full",
    "KeepSet",
    "KeyDiff",
    "Keys",
    "Needs",
    "Observation",
    "Policy",
    "SnapKV",
    "StreamingLLM",
    "Tunable",
    "evicting",
    "evicts",
    "help_lines",
    "keeps_all",
    "label",
    "make_policy",
    "needs_of",
    "parse_settings",
    "policy_class",
    "reads_attention",
]
