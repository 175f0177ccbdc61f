"""``kvtrim bench``: see runner.py for what is measured and report.py for the output."""

from __future__ import annotations

from .runner import BenchConfig, run, steps_total

__all__ = ["BenchConfig", "run", "steps_total"]
