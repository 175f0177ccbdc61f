"""StreamingLLM: attention sinks plus a recent window.

Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (2023).
Keeps the first ``n_sink`` tokens and the most recent ones; the same as what
llama.cpp's context shift keeps. Needs no attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Observation, Policy, Reads, sinks


@dataclass
class StreamingLLM(Policy):
    """Score = recency (the token id), so the budget fills with the newest tokens."""

    n_sink: int = sinks(4)
    recent: int = 0

    name: ClassVar[str] = "streaming"
    label: ClassVar[str] = "StreamingLLM"
    help: ClassVar[str] = (
        "Attention sinks plus the most recent tokens, what llama.cpp's context shift "
        "keeps (Xiao et al. 2023, StreamingLLM)."
    )
    reads: ClassVar[Reads] = "nothing"
    recency_only: ClassVar[bool] = True

    def score(self, ids: np.ndarray, query: Observation | None) -> np.ndarray:
        return ids.astype(np.float64)
