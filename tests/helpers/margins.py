"""Numeric checks on the real model's output that say how close they came.

``check(name, value, op, limit)`` asserts ``value op limit`` and, when
``$KVTRIM_MARGINS`` names a file, appends the figure to it as a JSON line with the
test's id and ``$KVTRIM_VARIANT``. ``scripts/numeric_margins.py`` runs the numeric
tests under each numeric variant (threads, weight repacking, batch size, another
llama.cpp build) and reports each check's smallest margin (docs/benchmarks/margins.md).
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Callable

MARGINS_ENV = "KVTRIM_MARGINS"
VARIANT_ENV = "KVTRIM_VARIANT"

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


def margin(value: float, op: str, limit: float) -> float:
    """How far ``value`` is on the passing side of ``limit`` (negative: failing)."""
    return value - limit if op.startswith(">") else limit - value


def check(name: str, value: float, op: str, limit: float) -> None:
    """Assert ``value op limit`` and record the figure (see the module docstring)."""
    value = float(value)
    passed = _OPS[op](value, limit)
    path = os.environ.get(MARGINS_ENV)
    if path:
        record = {
            "test": os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0],
            "check": name,
            "value": value,
            "op": op,
            "limit": limit,
            "margin": margin(value, op, limit),
            "variant": os.environ.get(VARIANT_ENV, ""),
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    assert passed, f"{name}: {value:.6g} is not {op} {limit:.6g}"
