"""argparse ``type=`` checks for kvtrim's options: a bad value is refused while
the command line is parsed, before a document is read or a model loaded.

>>> parser.add_argument("--max-tokens", type=at_least(1, "tokens"))
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from ..native.embedded import DEFAULT, EMBEDDED
from ..native.kvmemory import KV_TYPES, SWA_CACHES
from ..session.config import usable_cpus

MODEL_OPTION: tuple[tuple[str, ...], dict[str, Any]] = (
    ("--model",),
    {
        "default": None,
        "metavar": "PATH|NAME",
        "help": "a GGUF file, or a model kvtrim ships: "
        + ", ".join(EMBEDDED)
        + f" (default: $KVTRIM_MODEL, else {DEFAULT})",
    },
)
"""``--model`` wherever a command loads a model (ask, summarize, chat, info, serve,
bench, the self-test)."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def at_least(low: int, unit: str = "") -> Callable[[str], int]:
    """A whole number >= ``low``; ``unit`` (tokens, layers) names it in the message."""
    units = f" {unit}" if unit else ""

    def check(text: str) -> int:
        value = _int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}{units}, got {value}")
        return value

    check.__name__ = f"at_least_{low}"
    return check


def threads(text: str) -> int:
    """1 to the number of logical CPUs: more threads than CPUs only slow llama.cpp down."""
    value = at_least(1, "thread")(text)
    cpus = usable_cpus()
    if value > cpus:
        raise argparse.ArgumentTypeError(
            f"{value} threads is more than the {cpus} logical CPUs this machine gives kvtrim"
        )
    return value


def temperature(text: str) -> float:
    """A finite number >= 0 (0 is greedy)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 is greedy), got {text}")
    return value


def top_p(text: str) -> float:
    """A probability mass in (0, 1]."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def min_p(text: str) -> float:
    """A fraction of the most likely token's probability, in [0, 1]."""
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1] (0 is off), got {text}")
    return value


Option = tuple[tuple[str, ...], dict[str, Any]]  # (flags, add_argument's keywords)

KV_OPTIONS: tuple[Option, ...] = (
    (
        ("--kv-type",),
        {
            "choices": list(KV_TYPES),
            "default": "f16",
            "help": "KV cache type: q8_0/q4_0 quantize K, and V too where flash attention "
            "runs (streaming, full); policies that read attention keep V in f16 (default: f16)",
        },
    ),
    (
        ("--swa-cache",),
        {
            "choices": list(SWA_CACHES),
            "default": "window",
            "help": "sliding-window layers (Gemma 2/3, gpt-oss, ...) hold window + chunk "
            "cells (window, llama.cpp's default) or a cell per held token (full) "
            "(default: window)",
        },
    ),
)
"""--kv-type and --swa-cache (ask, summarize, chat, serve)."""


def kv_options(p: argparse.ArgumentParser) -> None:
    """--kv-type and --swa-cache (serve)."""
    for flags, keywords in KV_OPTIONS:
        p.add_argument(*flags, **keywords)
