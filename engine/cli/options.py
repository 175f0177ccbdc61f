"""What several commands build the same way from their options."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..policies import POLICIES
from ..runtime.engine import Engine
from .types import Option

__all__ = ["Option", "add_options", "engine_from_args", "policy_args_help"]


def policy_args_help() -> str:
    """What ``--policy-arg`` takes, per policy: ``snapkv: n_sink 0..4096 (4), ...``;
    built from each policy's fields (``Policy.tunables``)."""
    parts = []
    for name, cls in POLICIES.items():
        tunables = cls.tunables()
        if tunables:
            parts.append(f"{name}: " + ", ".join(t.describe() for t in tunables))
    return "; ".join(parts).replace("%", "%%")


def engine_from_args(args: argparse.Namespace) -> Engine:
    """The model and engine defaults the options name (``info`` has no --threads,
    ``chat`` no K/V types)."""
    return Engine(
        args.model,
        n_gpu_layers=args.gpu_layers,
        n_threads=getattr(args, "threads", None),
        repack=args.repack,
        kv_type=getattr(args, "kv_type", "f16"),
        swa_cache=getattr(args, "swa_cache", "window"),
    )


def add_options(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """``parser.add_argument(*flags, **keywords)`` for each option, in order (the
    order ``--help`` lists them in)."""
    for flags, keywords in options:
        parser.add_argument(*flags, **keywords)
