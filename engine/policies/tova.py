"""TOVA: the newest query decides.

Oren et al., "Transformers are Multi-State RNNs" (2024). When the cache is
full, the token with the lowest attention from the current (last) query row,
averaged over heads and global layers, is dropped. No sinks or recent window
are forced; the query's own token is kept by its attention to itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Keys, Observation, Policy, realign, recent_window, sinks


@dataclass
class TOVA(Policy):
    """Score = attention of the newest query row (units: probability)."""

    n_sink: int = sinks(0)
    recent: int = recent_window(1)

    name: ClassVar[str] = "tova"
    label: ClassVar[str] = "TOVA"
    help: ClassVar[str] = "Tokens the newest query attends to (Oren et al. 2024, TOVA)."
    query_rows: ClassVar[int | None] = 1

    _last: Observation | None = field(default=None, repr=False)

    def observe(self, obs: Observation | Keys) -> None:
        assert isinstance(obs, Observation)
        self._last = Observation(obs.ids, obs.attn[-1:])

    def reset(self) -> None:
        self._last = None

    def state_dict(self) -> dict[str, np.ndarray]:
        return {} if self._last is None else {"ids": self._last.ids, "attn": self._last.attn}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._last = Observation(state["ids"], state["attn"]) if "ids" in state else None

    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        latest = query if query is not None else self._last
        if latest is None:
            return np.zeros(len(ids))
        return realign(latest.attn[-1], latest.ids, ids)
