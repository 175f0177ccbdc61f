"""Attention capture through llama.cpp's eval callback.

Only the ``kq_soft_max-<layer>`` tensors of the chosen layers are observed (the
global layers on sliding-window models, which see the whole cache), and only
the query rows a policy asked for are copied out. Heads are reduced by their
mean and layers by their mean, so one row is a probability distribution over
KV cells (units: attention probability, summing to 1 per row).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import _ggml

_PREFIX = b"kq_soft_max-"


@dataclass
class Captured:
    """What one decode call yielded, in cell space.

    ``visible``: bool ``(n_rows, n_kv)``, which cells each query row could see.
    ``attn``: float32 ``(k, n_kv)``, the last k query rows, head- and layer-mean.
    ``seconds``: wall time spent inside the callback copying and reducing.
    """

    visible: np.ndarray | None
    attn: np.ndarray | None
    seconds: float


class AttentionCapture:
    """The eval callback's state: armed before each decode, read after it."""

    def __init__(self, layers: Sequence[int]) -> None:
        if not layers:
            raise ValueError("at least one layer to capture is needed")
        self.layers = tuple(layers)
        self._wanted = {str(layer).encode() for layer in self.layers}
        self._armed = False
        self._rows = 0
        self._n_rows = 0
        self._visibility = False
        self._visible: np.ndarray | None = None
        self._attn: np.ndarray | None = None
        self._n_layers_seen = 0
        self._seconds = 0.0
        self.error: BaseException | None = None
        self.c_callback = _ggml.make_eval_callback(self._on_tensor)

    def arm(self, n_rows: int, rows: int, visibility: bool) -> None:
        """Capture the next decode of ``n_rows`` tokens: the last ``rows`` rows
        (0 for none, or all when ``rows >= n_rows``) and, if asked, visibility."""
        self._armed = rows > 0 or visibility
        self._n_rows = n_rows
        self._rows = min(rows, n_rows)
        self._visibility = visibility
        self._visible = None
        self._attn = None
        self._n_layers_seen = 0
        self._seconds = 0.0
        self.error = None

    def take(self) -> Captured:
        """What the last armed decode captured; disarms."""
        self._armed = False
        if self.error is not None:
            raise self.error
        attn = self._attn
        if attn is not None and self._n_layers_seen > 1:
            attn /= self._n_layers_seen
        return Captured(self._visible, attn, self._seconds)

    def _on_tensor(self, tensor: int, ask: bool, _user_data: int | None) -> bool:
        # ask=True: do we want this node? ask=False: it is computed, read it; returning
        # False then would stop the graph, so every path below answers "not ask".
        if not self._armed or not tensor:
            return not ask
        name = _ggml.tensor_name_bytes(tensor)
        if not name.startswith(_PREFIX) or name[len(_PREFIX) :] not in self._wanted:
            return not ask
        if ask:
            return True
        start = time.perf_counter()
        try:
            self._read(tensor, first=self._n_layers_seen == 0)
        except BaseException as exc:  # surfaced by take(); never raise into C
            self.error = exc
        self._seconds += time.perf_counter() - start
        return True

    def _read(self, tensor: int, first: bool) -> None:
        n_rows = self._n_rows
        need_all = first and self._visibility
        row0 = 0 if need_all else n_rows - self._rows
        probs = _ggml.read_rows(tensor, row0, n_rows)  # (heads, rows, n_kv)
        if need_all:
            self._visible = (probs > 0).any(axis=0)
        self._n_layers_seen += 1
        if self._rows == 0:
            return
        tail = probs[:, probs.shape[1] - self._rows :, :].mean(axis=0)
        if self._attn is None:
            self._attn = tail
        else:
            self._attn += tail
