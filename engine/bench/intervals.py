"""Confidence intervals for accuracies over a number of items (95% by default).

``wilson``: the Wilson score interval of one proportion (Wilson 1927), which stays
inside [0, 1] and is honest for small n and for 0/n or n/n, where the normal
approximation is not. ``paired_difference``: the interval of the difference of two
accuracies measured on the same items (Newcombe 1998, "Improved confidence intervals
for the difference between binomial proportions based on paired data", method 10:
the two Wilson intervals combined with the correlation of the pairs). A setting is
separated from another only where this interval excludes 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson(hits: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``hits / n``, as fractions; (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= hits <= n:
        raise ValueError(f"hits must be in 0..{n}, got {hits}")
    p = hits / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_difference(
    first: Sequence[bool], second: Sequence[bool], z: float = Z95
) -> tuple[float, float, float]:
    """``(difference, low, high)`` of accuracy(first) - accuracy(second) over the same
    items, in fractions (Newcombe's method 10); (0, -1, 1) with no items."""
    if len(first) != len(second):
        raise ValueError("the two settings must be scored on the same items")
    n = len(first)
    if n == 0:
        return 0.0, -1.0, 1.0
    a = sum(1 for x, y in zip(first, second, strict=True) if x and y)
    b = sum(1 for x, y in zip(first, second, strict=True) if x and not y)
    c = sum(1 for x, y in zip(first, second, strict=True) if y and not x)
    d = n - a - b - c
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n, z)
    l2, u2 = wilson(a + c, n, z)
    phi = _phi(a, b, c, d, n)
    below = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    above = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    diff = p1 - p2
    return diff, max(-1.0, diff - below), min(1.0, diff + above)


def _phi(a: int, b: int, c: int, d: int, n: int) -> float:
    """The pairs' correlation as Newcombe uses it: the phi coefficient of the 2x2
    table, its numerator shrunk by n/2 towards 0 when positive; 0 where a margin is
    empty."""
    denominator = (a + b) * (c + d) * (a + c) * (b + d)
    if denominator == 0:
        return 0.0
    numerator = a * d - b * c
    if numerator > 0:
        numerator = max(numerator - n / 2, 0.0)
    return numerator / math.sqrt(denominator)


def separated(low: float, high: float) -> bool:
    """Whether an interval of a difference excludes 0."""
    return low > 0 or high < 0
