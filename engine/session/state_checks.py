"""The invariants a saved cache must hold before any of it is used (issue 36).

A ``.kvstate`` file is data from disk: a bit flip, a truncated write or a planted
file can hold token ids past the vocabulary (llama.cpp aborts the process on them in
``token_to_piece``), ids past the stream (the memory map indexes with them), lengths
that disagree, or bytes llama.cpp cannot parse. ``check`` tests every array against
what the session and the model allow and raises ``DamagedStateError`` naming the
first that fails; only then is the llama.cpp part loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DamagedStateError

MAX_IDS = 1 << 26  # tokens a saved stream may have read (64M: far past any real text)


def _ints(arrays: dict[str, np.ndarray], name: str) -> np.ndarray:
    """``arrays[name]`` as a 1-D int64 array; damaged when it is not one."""
    value = np.asarray(arrays[name])
    if value.ndim != 1 or not (value.dtype.kind in "iu" or len(value) == 0):
        raise DamagedStateError(f"its {name} are not a list of whole numbers")
    return value.astype(np.int64)


def _within(values: np.ndarray, low: int, high: int, what: str) -> None:
    """Every value in ``[low, high)``."""
    if len(values) and (values.min() < low or values.max() >= high):
        raise DamagedStateError(f"its {what} lie outside {low:,}..{high - 1:,}")


def _count(meta: dict[str, Any], name: str, high: int) -> int:
    value = meta.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise DamagedStateError(f"its {name} is not a count in 0..{high:,}")
    return value


def check(
    meta: dict[str, Any],
    arrays: dict[str, np.ndarray],
    *,
    n_vocab: int,
    max_position: int,
    cells: int,
) -> None:
    """Raise ``DamagedStateError`` unless the saved cache is whole and consistent: held
    ids, positions and words of one length, in order and inside the stream; document
    tokens, logits and the memory map's sources within the model and the stream; at
    most ``cells`` tokens. Checks arrays only: llama.cpp's part is parsed after."""
    try:
        _check(meta, arrays, n_vocab=n_vocab, max_position=max_position, cells=cells)
    except KeyError as exc:
        raise DamagedStateError(f"it has no {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise DamagedStateError(f"{type(exc).__name__}: {exc}") from None


def _check(
    meta: dict[str, Any], a: dict[str, np.ndarray], *, n_vocab: int, max_position: int, cells: int
) -> None:
    n_ids = _trace_ids(meta["segments"], a)
    next_id = _count(meta, "next_id", n_ids)
    word = meta["word"]
    if not (
        isinstance(word, list) and len(word) == 3 and all(type(w) in (int, bool) for w in word)
    ):
        raise DamagedStateError("its word state is not three numbers")
    _count(meta, "evicted", MAX_IDS)
    _count(meta, "compactions", MAX_IDS)
    if type(meta.get("flash_attn")) not in (bool, type(None)):
        raise DamagedStateError("its flash attention is not on, off or llama.cpp's")
    if type(meta.get("predicted", False)) is not bool:
        raise DamagedStateError("whether a turn ended in it is not true or false")
    next_lpos = _count(meta, "next_lpos", max_position)
    ids, lpos, words = (_ints(a, k) for k in ("ids", "lpos", "words"))
    n = len(ids)
    if not len(lpos) == len(words) == n or n > cells:
        raise DamagedStateError(
            f"it holds {n:,} ids, {len(lpos):,} positions, {len(words):,} words"
        )
    if n and (np.any(np.diff(ids) <= 0) or np.any(np.diff(lpos) <= 0)):
        raise DamagedStateError("its ids or positions are not in order")
    _within(ids, 0, next_id, "held ids")
    _within(lpos, 0, next_lpos, "positions")
    if n and (np.any(words > ids) or words.min() < 0):
        raise DamagedStateError("its words do not start at or before their tokens")
    if "cell_positions" in a:
        order = _ints(a, "cell_positions")
        if len(order) != n or not np.array_equal(np.sort(order), lpos):
            raise DamagedStateError("its cell map does not hold its positions")
    if "logits" in a:
        logits = np.asarray(a["logits"])
        if logits.shape != (n_vocab,) or not np.isfinite(logits).all():
            raise DamagedStateError("its last logits do not fit the model's vocabulary")
    _check_document(meta, a, n_vocab, next_id)
    copy_ids, copy_src = _ints(a, "copy_ids"), _ints(a, "copy_src")
    if len(copy_ids) != len(copy_src):
        raise DamagedStateError("its recalled copies disagree in length")
    _within(copy_ids, 0, max(next_id, 1), "recalled ids")
    _within(copy_src, -1, max(next_id, 1), "recalled sources")
    for key in a:  # a policy's ids (H2O's sums, SnapKV's rows, KeyDiff's keys)
        if key.startswith("policy") and key.endswith("ids"):
            _within(_ints(a, key), 0, max(next_id, 1), "policy's ids")


def _check_document(
    meta: dict[str, Any], a: dict[str, np.ndarray], n_vocab: int, next_id: int
) -> None:
    """The document's tokens (what follow-ups recall) are the model's tokens, read."""
    first = meta.get("document_first_id")
    if first is None:
        return
    tokens = _ints(a, "document")
    _within(tokens, 0, n_vocab, "document tokens")
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        raise DamagedStateError("its document's first id is not a count")
    if first + len(tokens) > next_id:
        raise DamagedStateError("its document runs past what was read")


def _trace_ids(segments: Sequence[Any], a: dict[str, np.ndarray]) -> int:
    """The ids the memory map's sources cover (checked: each segment's spans lie in its
    text, segments follow each other)."""
    if not isinstance(segments, list):
        raise DamagedStateError("its memory map is not a list")
    n_ids = 0
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict) or not isinstance(seg.get("text"), str):
            raise DamagedStateError(f"its memory map's part {i} is not a text")
        starts, ends = _ints(a, f"trace.{i}.starts"), _ints(a, f"trace.{i}.ends")
        first = seg.get("first_id")
        if len(starts) != len(ends) or not isinstance(first, int) or first != n_ids:
            raise DamagedStateError(f"its memory map's part {i} does not follow the one before")
        _within(np.concatenate((starts, ends)), 0, len(seg["text"]) + 1, "memory map's spans")
        n_ids = first + len(starts)
        if n_ids > MAX_IDS:
            raise DamagedStateError(f"its memory map covers over {MAX_IDS:,} tokens")
    scores = np.asarray(a["trace.scores"])
    if scores.ndim != 1 or len(scores) > 2 * n_ids + 2:
        raise DamagedStateError("its scores do not fit its memory map")
    return n_ids
