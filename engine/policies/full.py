"""No eviction: the full-cache baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Observation, Policy, Reads


@dataclass
class Full(Policy):
    """Keeps every token; a run whose input does not fit the cache fails clearly."""

    n_sink: int = 0
    recent: int = 0

    name: ClassVar[str] = "full"
    label: ClassVar[str] = "Full cache"
    help: ClassVar[str] = (
        "Keeps every token; fails clearly when the input does not fit the budget (the baseline)."
    )
    reads: ClassVar[Reads] = "nothing"
    evicts: ClassVar[bool] = False

    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        return np.ones(len(ids))
