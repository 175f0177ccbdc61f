"""H2O: heavy hitters plus a recent window, decided online.

Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of
Large Language Models" (NeurIPS 2023). A token's score is the attention it has
received, summed over every query row processed so far (prefill and decode),
averaged over heads and global layers (units: attention probability mass).
The paper's split is half heavy hitters, half recent tokens: unless ``recent``
is set, ``recent_ratio`` of the budget is kept as the recent window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Keys, Observation, Policy, param, realign, recent_window, sinks


@dataclass
class H2O(Policy):
    """Accumulated attention per token; ``recent_ratio`` of the budget is recent."""

    n_sink: int = sinks(0)
    recent: int = recent_window(
        0, "The newest tokens, always kept; 0 keeps the recent share of the budget."
    )
    recent_ratio: float = param(
        0.5,
        "Recent share",
        "The budget's share kept as the recent window (the paper: half).",
        0.0,
        1.0,
    )

    name: ClassVar[str] = "h2o"
    label: ClassVar[str] = "H2O"
    help: ClassVar[str] = (
        "Heavy hitters by attention accumulated over every query so far, plus a recent "
        "window (Zhang et al. 2023, H2O)."
    )
    query_rows: ClassVar[int | None] = None

    _ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _acc: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def recent_for(self, budget: int) -> int:
        return self.recent or int(budget * self.recent_ratio)

    def observe(self, obs: Observation | Keys) -> None:
        assert isinstance(obs, Observation)
        acc = realign(self._acc, self._ids, obs.ids)
        self._ids, self._acc = obs.ids, acc + obs.attn.sum(axis=0)

    def reset(self) -> None:
        self._ids, self._acc = np.zeros(0, np.int64), np.zeros(0)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"ids": self._ids, "acc": self._acc}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._ids, self._acc = state["ids"], state["acc"]

    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        acc = realign(self._acc, self._ids, ids)
        if query is not None:
            acc = acc + realign(query.attn.sum(axis=0), query.ids, ids)
        return acc
