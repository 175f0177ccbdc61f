"""Attention and key capture through llama.cpp's eval callback.

Only the chosen layers are observed (the global layers on sliding-window models,
which see the whole cache), and only the query rows a policy asked for. Without
flash attention they are copied from the ``kq_soft_max-<layer>`` tensors. With it
the probabilities are never written, so they are computed from the fused node's
own inputs (the node under ``kqv_out-<layer>``: Q, the K view of the cache, the
mask, its scale and softcap) as ``softmax(scale * Q K^T + mask)`` per head, the
query rounded to f16 as ggml's kernels round it; which cells a row saw is read
from the mask. Heads are reduced by their mean and layers by their mean, so one
row is a probability distribution over KV cells (units: attention probability,
summing to 1 per row).

Keys (for policies that score keys, such as KeyDiff) are the ``Kcur-<layer>``
tensors of the same layers as RoPE left them, which is what the cache stores: the
last node of that name and shape ``[head_dim, n_head_kv, n_tokens]`` in a layer's
graph. They exist with flash attention on, so such policies keep it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from . import _ggml

_PREFIX = b"kq_soft_max-"
_FUSED = b"kqv_out-"
_FLASH_OP = b"FLASH_ATTN_EXT"
_KEYS = b"Kcur-"
_KEY, _ATTN = 0, 1  # the order of a captured layer's nodes in its graph


@dataclass
class Captured:
    """What one decode call yielded for one sequence, in cell space.

    ``visible``: bool ``(n_rows, n_kv)``, which cells each query row could see.
    ``attn``: float32 ``(k, n_kv)``, the last k query rows, head- and layer-mean.
    ``seconds``: wall time spent inside the callback copying and reducing.
    ``keys``: float16 ``(n_rows, layers, n_head_kv, head_dim)``, each key of unit length.
    """

    visible: np.ndarray | None
    attn: np.ndarray | None
    seconds: float
    keys: np.ndarray | None = None


@dataclass(frozen=True)
class Segment:
    """The rows ``[start, stop)`` of one sequence in KV stream ``stream`` of the
    batch: keep its last ``rows`` attention rows (0: none), with ``visibility``
    which cells each row saw, with ``keys`` the keys of its rows. ``owner``: the
    result it adds to where one sequence's rows span ubatches (``Ubatch``)."""

    start: int
    stop: int
    rows: int
    visibility: bool
    stream: int = 0
    keys: bool = False
    owner: int = 0

    @property
    def wanted(self) -> bool:
        return self.rows > 0 or self.visibility or self.keys


@dataclass(frozen=True)
class Ubatch:
    """One of the ubatches llama.cpp splits a decode into (ubatch.py): ``n_rows``
    rows in each of its ``n_streams`` KV streams, and its ``segments``."""

    n_rows: int
    n_streams: int
    segments: tuple[Segment, ...]


class _Part:
    """What the callback gathers for one segment during a decode."""

    def __init__(self, seg: Segment) -> None:
        self.seg = seg
        self.rows = min(seg.rows, seg.stop - seg.start)
        self.visible: np.ndarray | None = None
        self.attn: np.ndarray | None = None
        self.layers = 0
        self.keys: dict[bytes, np.ndarray] = {}  # by layer: the last key node read wins

    @property
    def sees(self) -> bool:
        """Which cells its rows saw is still to be read (the first layer read gives it)."""
        return self.seg.visibility and self.layers == 0

    @property
    def wants_attention(self) -> bool:
        """A layer's attention is still wanted: rows to add up, or what the rows saw."""
        return bool(self.rows) or self.sees

    def add(self, rows: np.ndarray) -> None:
        """Add one layer's head-mean rows (``take`` divides by the layers read)."""
        if self.attn is None:
            self.attn = rows
        else:
            self.attn += rows


class Capture:
    """The eval callback's state: armed before each decode, read after it.

    One decode may hold several sequences (see pool.py): each is a ``Segment``
    of the batch's rows, and ``take`` returns one ``Captured`` per segment. With
    one shared cache (``kv_unified``) the tensor has one stream and rows in batch
    order; another sequence's cells are masked, probability exactly 0. With one
    KV stream per sequence it is ``[n_kv, rows, heads, streams]``: each sequence
    has its own stream slot, rows and cells (docs/multiseq.md §2). ``key_shape``
    (head_dim, n_head_kv) lets segments ask for keys too.
    """

    def __init__(self, layers: Sequence[int], key_shape: tuple[int, int] | None = None) -> None:
        if not layers:
            raise ValueError("at least one layer to capture is needed")
        self.layers = tuple(layers)
        self.key_shape = key_shape
        self._rank = {str(layer).encode(): i for i, layer in enumerate(sorted(self.layers))}
        self._live = False  # armed, and some node of this decode may still be read
        self._keys = False
        self._plan: list[tuple[Ubatch, list[_Part]]] = []
        self._ub = -1  # the ubatch whose graph runs now (-1: none seen yet)
        self._last = -1  # the last ubatch that wants something
        self._phase: tuple[int, int] | None = None  # (layer rank, kind) of the last node seen
        self._seconds = 0.0
        self.error: BaseException | None = None
        self.c_callback = _ggml.make_eval_callback(self._on_tensor)

    def arm(self, n_rows: int, segments: Sequence[Segment], n_streams: int = 1) -> None:
        """Capture the next decode, one ubatch of ``n_rows`` rows in each of
        ``n_streams`` KV streams, for ``segments`` (one result each)."""
        segs = tuple(replace(s, owner=i) for i, s in enumerate(segments))
        self.arm_ubatches([Ubatch(n_rows, n_streams, segs)])

    def arm_ubatches(self, ubatches: Sequence[Ubatch]) -> None:
        """Capture the next decode, which llama.cpp splits into ``ubatches``; the
        segments of one ``owner`` are joined, in ubatch order, into one result."""
        segments = [s for u in ubatches for s in u.segments]
        if self.key_shape is None and any(s.keys for s in segments):
            raise ValueError("this capture was made without keys")
        self._plan = [(u, [_Part(s) for s in u.segments]) for u in ubatches]
        wanting = [i for i, u in enumerate(ubatches) if any(s.wanted for s in u.segments)]
        self._last = wanting[-1] if wanting else -1
        self._live = bool(wanting)
        self._keys = any(s.keys for s in segments)
        self._ub, self._phase = -1, None
        self._seconds = 0.0
        self.error = None

    def take(self) -> list[Captured]:
        """What the last armed decode captured, one per owner (in owner order); disarms."""
        self._live = False
        if self.error is not None:
            raise self.error
        if self._ub < self._last:
            raise RuntimeError(
                f"capture lost track: {self._ub + 1} ubatches seen, {self._last + 1} wanted"
            )
        owners: dict[int, list[_Part]] = {}
        for _u, parts in self._plan:
            for part in parts:
                owners.setdefault(part.seg.owner, []).append(part)
        return [_join(owners[o], self._seconds) for o in sorted(owners)]

    def disarm(self) -> list[Captured]:
        """The armed decode failed before it ran: nothing was captured."""
        self._live = False
        return []

    @property
    def _parts(self) -> list[_Part]:
        return self._plan[self._ub][1] if 0 <= self._ub < len(self._plan) else []

    @property
    def _ubatch(self) -> Ubatch:
        """The ubatch whose graph runs now (a node was followed into it)."""
        return self._plan[self._ub][0]

    def _on_tensor(self, tensor: int, ask: bool, _user_data: int | None) -> bool:
        # ask=True: do we want this node? ask=False: it is computed, read it; returning
        # False then would stop the graph, so every path below answers "not ask".
        # Most nodes of most decodes end at the first test (a pooled step that fits
        # reads only which cells it sees, from its first layer).
        if not self._live or not tensor:
            return not ask
        name = _ggml.tensor_name_bytes(tensor)
        if name.startswith(_PREFIX) and name[len(_PREFIX) :] in self._rank:
            kind, layer, read = _ATTN, name[len(_PREFIX) :], self._read
        elif name.startswith(_FUSED) and self._is_fused(tensor, name):
            kind, layer, read = _ATTN, name[len(_FUSED) :], self._read_fused
        elif self._keys and name.startswith(_KEYS) and name[len(_KEYS) :] in self._rank:
            kind, layer, read = _KEY, name[len(_KEYS) :], self._read_keys
        else:
            return not ask
        if ask and not self._follow(self._rank[layer], kind):
            return False
        if kind == _ATTN and not self._attention_wanted():
            return not ask
        if kind == _KEY and not self._is_key(tensor):
            return not ask
        if ask:
            return True
        start = time.perf_counter()
        try:
            read(tensor)
        except BaseException as exc:  # surfaced by take(); never raise into C
            self.error = exc
        self._live = self.error is None and self._more()
        self._seconds += time.perf_counter() - start
        return True

    def _follow(self, rank: int, kind: int) -> bool:
        """Note a node of a captured layer (asked once each); a node that comes before
        the last one in a layer's order starts the next ubatch's graph. False: more
        ubatches than planned (the capture stops and ``take`` raises)."""
        at = (rank, kind)
        if self._phase is None or at < self._phase or (at == self._phase and kind == _ATTN):
            self._ub += 1
            if self._ub >= len(self._plan):
                self.error = RuntimeError(
                    f"capture lost track: more than the {len(self._plan)} ubatches planned"
                )
                self._live = False
                return False
        self._phase = at
        return True

    def _more(self) -> bool:
        """Some node of this decode is still to be read: the ubatch running now still
        wants keys or attention, or a later one wants something."""
        keys = any(p.seg.keys for p in self._parts)
        return self._ub < self._last or keys or self._attention_wanted()

    def _is_key(self, tensor: int) -> bool:
        """A layer's keys as the cache takes them: ``[head_dim, n_head_kv, tokens]``."""
        if self.key_shape is None:
            return False
        head_dim, n_head, n_tokens, _ = _ggml.tensor_shape(tensor)
        ub = self._ubatch
        return (head_dim, n_head) == self.key_shape and n_tokens == ub.n_rows * ub.n_streams

    def _read_keys(self, tensor: int) -> None:
        layer = _ggml.tensor_name_bytes(tensor)[len(_KEYS) :]
        for part in self._parts:
            seg = part.seg
            if not seg.keys:
                continue
            row0 = seg.stream * self._ubatch.n_rows + seg.start
            keys = _ggml.read_keys(tensor, row0, row0 + seg.stop - seg.start)
            norms = np.linalg.norm(keys, axis=-1, keepdims=True)
            part.keys[layer] = (keys / np.maximum(norms, 1e-12)).astype(np.float16)

    def _attention_wanted(self) -> bool:
        """Whether some segment still wants a layer's attention (each asked node splits
        llama.cpp's graph compute in two)."""
        return any(p.wants_attention for p in self._parts)

    def _check_rows(self, n_rows: int, n_stream: int) -> None:
        ub = self._ubatch
        if n_rows != ub.n_rows or n_stream != ub.n_streams:
            raise RuntimeError(
                f"capture lost track: {n_rows} rows in {n_stream} streams, expected "
                f"{ub.n_rows} in {ub.n_streams} (ubatch {self._ub + 1} of {len(self._plan)})"
            )

    def _is_fused(self, tensor: int, name: bytes) -> bool:
        """A wanted layer's attention output computed by flash attention."""
        if name[len(_FUSED) :] not in self._rank:
            return False
        src = _ggml.tensor_src(tensor, 0)
        return bool(src) and _ggml.tensor_op(src) == _FLASH_OP

    def _read_fused(self, tensor: int) -> None:
        fused = _ggml.tensor_src(tensor, 0)
        q_t, k_t, mask_t, sinks_t = (_ggml.tensor_src(fused, i) for i in (0, 1, 3, 4))
        _head_dim, n_rows, _n_head, n_stream = _ggml.tensor_shape(q_t)
        self._check_rows(n_rows, n_stream)
        scale, max_bias, softcap = _ggml.op_params_f32(fused, 3)
        if max_bias:
            raise RuntimeError("reading attention of a model with ALiBi is not supported")
        wanted = [p for p in self._parts if p.wants_attention]
        if not wanted or not mask_t:
            return
        mask = _ggml.read_tensor(mask_t)  # (streams, heads or 1, rows padded, n_kv)
        q = k = sinks = None
        if any(p.rows for p in wanted):
            q = _ggml.read_tensor(q_t)  # (streams, heads, rows, head_dim)
            k = _ggml.read_tensor(k_t)  # (streams, kv heads, n_kv, head_dim)
            sinks = _ggml.read_tensor(sinks_t).reshape(-1) if sinks_t else None
        for part in wanted:
            seg = part.seg
            masks = mask[seg.stream % mask.shape[0]]
            if part.sees:
                part.visible = (masks[:, seg.start : seg.stop] > -np.inf).any(axis=0)
            part.layers += 1
            if not part.rows or q is None or k is None:
                continue
            row0 = seg.stop - part.rows
            probs = attention(
                q[seg.stream, :, row0 : seg.stop],
                k[seg.stream],
                masks[:, row0 : seg.stop],
                scale,
                softcap,
                sinks,
            )
            part.add(probs.mean(axis=0))

    def _read(self, tensor: int) -> None:
        _n_kv, n_rows, n_head, n_stream = _ggml.tensor_shape(tensor)
        self._check_rows(n_rows, n_stream)
        starts = {}
        for part in self._parts:
            seg = part.seg
            if part.wants_attention:
                starts[id(part)] = seg.start if part.sees else seg.stop - part.rows
        # one stream: each segment's own rows; several: the same rows of every
        # stream at once, each segment then takes its stream's heads
        shared = None
        if n_stream > 1 and starts:
            row0 = min(starts.values())
            shared = (row0, _ggml.read_rows(tensor, row0, n_rows))
        for part in self._parts:
            seg = part.seg
            if id(part) not in starts:
                continue
            row0 = starts[id(part)]
            if shared is None:
                probs = _ggml.read_rows(tensor, row0, seg.stop)  # (heads, rows, n_kv)
            else:
                at, block = shared
                heads = block[seg.stream * n_head : (seg.stream + 1) * n_head]
                probs = heads[:, row0 - at : seg.stop - at, :]
            if part.sees:
                part.visible = (probs > 0).any(axis=0)
            part.layers += 1
            if not part.rows:
                continue
            part.add(probs[:, probs.shape[1] - part.rows :, :].mean(axis=0))


def _join(parts: Sequence[_Part], seconds: float) -> Captured:
    """One sequence's result from its parts, one per ubatch its rows were in (each
    ubatch has its own ``n_kv``: the narrower are padded with unseen cells)."""
    for part in parts:
        if part.attn is not None and part.layers > 1:
            part.attn /= part.layers
            part.layers = 1
    keys = [np.stack([p.keys[k] for k in sorted(p.keys, key=int)], axis=1) for p in parts if p.keys]
    return Captured(
        _rows([p.visible for p in parts if p.visible is not None]),
        _rows([p.attn for p in parts if p.attn is not None]),
        seconds,
        np.concatenate(keys) if keys else None,
    )


def _rows(blocks: list[np.ndarray]) -> np.ndarray | None:
    """Row blocks of several widths stacked, each padded on the right with zeros."""
    if not blocks:
        return None
    if len(blocks) == 1:
        return blocks[0]
    width = max(b.shape[1] for b in blocks)
    return np.concatenate([np.pad(b, ((0, 0), (0, width - b.shape[1]))) for b in blocks])


def attention(
    q: np.ndarray,
    k: np.ndarray,
    mask: np.ndarray,
    scale: float,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """Attention probabilities as ggml's flash attention weighs V: ``q`` (heads, rows,
    head_dim), ``k`` (kv heads, n_kv, head_dim; query head h reads kv head
    ``h // (heads / kv heads)``), ``mask`` (1 or heads, rows, n_kv; -inf hides a
    cell). Returns float32 (heads, rows, n_kv), each row summing to 1 (less what
    the optional per-head ``sinks`` logits take)."""
    n_head, rows, head_dim = q.shape
    n_kv_head, n_kv, _ = k.shape
    if n_head % n_kv_head:
        raise ValueError(f"{n_head} query heads do not share {n_kv_head} kv heads evenly")
    q16 = q.astype(np.float16).astype(np.float32)  # ggml rounds Q to K's f16 for the dot
    grouped = q16.reshape(n_kv_head, (n_head // n_kv_head) * rows, head_dim)
    scores = np.matmul(grouped, k.transpose(0, 2, 1)).reshape(n_head, rows, n_kv)
    if softcap:
        scores = softcap * np.tanh(scores * (scale / softcap))
    else:
        scores *= scale
    scores += mask[..., :n_kv]
    top = scores.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks.reshape(-1, 1, 1))
    top = np.where(np.isfinite(top), top, 0.0)
    weights = np.exp(scores - top)
    total = weights.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sinks.reshape(-1, 1, 1) - top)
    return (weights / np.maximum(total, np.finfo(np.float32).tiny)).astype(np.float32)
