"""KeyDiff: keep the keys that differ most from the rest.

Park et al., "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
Inference in Resource-Constrained Environments" (2025). A token's score is minus the
cosine similarity of its key to the anchor, the mean of the held tokens' unit keys
(per layer and KV head, averaged over the global layers and heads): keys that point
where most keys point carry little, distinct ones are kept. It reads keys, not
attention, so llama.cpp's flash attention stays on and no question votes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Keys, Observation, Policy, Reads, recent_window, sinks


@dataclass
class KeyDiff(Policy):
    """Score = -cos(key, mean unit key of the held tokens) (units: cosine, -1..1)."""

    n_sink: int = sinks(4)
    recent: int = recent_window(32)

    name: ClassVar[str] = "keydiff"
    label: ClassVar[str] = "KeyDiff"
    help: ClassVar[str] = (
        "Tokens whose keys differ most from the average key; reads no attention "
        "(Park et al. 2025, KeyDiff)."
    )
    reads: ClassVar[Reads] = "keys"

    _ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _keys: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 0, 0, 0), np.float16), repr=False
    )

    def observe(self, obs: Observation | Keys) -> None:
        assert isinstance(obs, Keys)
        if len(self._ids) and self._keys.shape[1:] != obs.vectors.shape[1:]:
            self.reset()  # another model's keys
        self._ids = np.concatenate((self._ids, obs.ids))
        self._keys = np.concatenate((self._keys, obs.vectors)) if len(self._keys) else obs.vectors

    def reset(self) -> None:
        self._ids, self._keys = np.zeros(0, np.int64), np.zeros((0, 0, 0, 0), np.float16)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"ids": self._ids, "keys": self._keys}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self._ids, self._keys = state["ids"], state["keys"]

    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        keep = np.isin(self._ids, ids)  # forget the evicted: their keys are gone
        self._ids, self._keys = self._ids[keep], self._keys[keep]
        scores = np.zeros(len(ids))
        if not len(self._ids):
            return scores
        keys = self._keys.astype(np.float32)
        anchor = keys.mean(axis=0)
        anchor /= np.maximum(np.linalg.norm(anchor, axis=-1, keepdims=True), 1e-12)
        cosine = np.einsum("nlhd,lhd->nlh", keys, anchor).mean(axis=(1, 2))
        at = np.searchsorted(self._ids, ids).clip(0, len(self._ids) - 1)
        found = self._ids[at] == ids
        scores[found] = -cosine[at[found]]
        return scores
