"""SnapKV: an observation window at the end of the prompt votes.

Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation"
(2024). The last ``window`` query rows' attention is summed per token (over
rows, averaged over heads and global layers), max-pooled over ``kernel``
neighbours so the context around a hit survives, and the top tokens are kept;
the window itself is always kept (``recent = window``). With a known question
its tokens are the window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from .base import Keys, Observation, Policy, max_pool, param, realign, recent_window, sinks


@dataclass
class SnapKV(Policy):
    """Votes of the last ``window`` query rows, max-pooled with ``kernel``."""

    n_sink: int = sinks(4)
    recent: int = recent_window(32)
    window: int = param(
        32, "Observation window", "The last query rows whose attention votes.", 1, 4096
    )
    kernel: int = param(7, "Pooling kernel", "Neighbours a vote spreads to (odd; 1: none).", 1, 63)

    name: ClassVar[str] = "snapkv"
    label: ClassVar[str] = "SnapKV"
    help: ClassVar[str] = (
        "Tokens the last queries, or the question, vote for, max-pooled over neighbours "
        "(Li et al. 2024, SnapKV)."
    )
    query_rows: ClassVar[int | None] = 32

    _rows: deque[Observation] = field(default_factory=deque, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.window < 1 or self.kernel < 1 or self.kernel % 2 == 0:
            raise ConfigError("snapkv: window must be >= 1 and kernel a positive odd number")

    def observe(self, obs: Observation | Keys) -> None:
        assert isinstance(obs, Observation)
        self._rows.append(obs)
        while sum(o.attn.shape[0] for o in self._rows) - self._rows[0].attn.shape[0] >= self.window:
            self._rows.popleft()

    def reset(self) -> None:
        self._rows.clear()

    def state_dict(self) -> dict[str, np.ndarray]:
        """The observed rows: each observation's ids and rows, one after another."""
        out: dict[str, np.ndarray] = {}
        for i, obs in enumerate(self._rows):
            out[f"{i}.ids"], out[f"{i}.attn"] = obs.ids, obs.attn
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        n = len({key.split(".")[0] for key in state})
        self._rows = deque(Observation(state[f"{i}.ids"], state[f"{i}.attn"]) for i in range(n))

    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        if query is not None:
            votes = realign(query.attn.sum(axis=0), query.ids, ids)
        else:
            votes = np.zeros(len(ids), dtype=np.float32)
            left = self.window
            for obs in reversed(self._rows):
                rows = obs.attn[-left:]
                votes += realign(rows.sum(axis=0), obs.ids, ids)
                left -= rows.shape[0]
                if left <= 0:
                    break
        return max_pool(votes, self.kernel)
