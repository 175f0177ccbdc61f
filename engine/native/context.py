"""The native llama.cpp context: creation, decode and KV edits.

A thin owner of native handles: C return codes become exceptions here, and the
eval and abort callbacks are kept alive as long as the context is. One context
holds one session's sequence 0, or (``n_seq_max > 1``, see pool.py) several
sequences in one shared pool of cells (llama.cpp's ``kv_unified``).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Sequence

import llama_cpp
import numpy as np
from llama_cpp import _internals

from ..errors import CacheFullError, Cancelled, EngineError, OutOfMemoryError
from . import _ggml
from .capture import Capture, Captured, Segment, Ubatch
from .cpu import one_blas_thread
from .kvmemory import KV_TYPES, swa_cells
from .model import Model, decoding

SEQ = 0
PYTHON_ABORT_FROM = 8  # on the main thread, decodes of more tokens ask Python (Ctrl+C)
_NO_ABORT = llama_cpp.ggml_abort_callback(0)  # a NULL callback


class AbortEvent(threading.Event):
    """A context's cancel: once set, a decode is refused before it starts, and one
    that runs stops at its next graph node (llama.cpp reads the ``flag`` in C). A
    set and a clear from two threads leave the flag as the event (one lock, which a
    Ctrl+C handler that interrupts ``clear`` on the same thread may take again)."""

    def __init__(self) -> None:
        super().__init__()
        self.flag = _ggml.AbortFlag()
        self._lock = threading.RLock()

    def set(self) -> None:
        with self._lock:
            super().set()
            self.flag.put(True)

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self.flag.put(False)


Pick = Callable[[np.ndarray], int]
"""Chooses the next token from a row of logits (float32, n_vocab) where llama.cpp
left it: the row is valid only during the call, and nothing is copied."""


def picked_token(token: int | None, error: Exception | None) -> int:
    """What a decode's ``Pick`` chose, or what it raised (the decode itself ran)."""
    if error is not None:
        raise error
    if token is None:
        raise EngineError("no token was picked")
    return token


def _context_params(
    n_ctx: int,
    n_batch: int,
    n_threads: int,
    *,
    flash_attn: bool | None,
    swa_full: bool,
    type_k: int,
    type_v: int,
    n_seq_max: int,
    kv_unified: bool,
    capture: Capture | None,
    abort: _ggml.AbortFlag,
    n_ubatch: int,
) -> llama_cpp.llama_context_params:
    """llama.cpp's context parameters for these settings; the caller keeps
    ``abort`` (and ``capture``'s callback) alive as long as the context."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = n_ctx
    params.n_batch = n_batch
    params.n_ubatch = n_ubatch
    params.n_seq_max = n_seq_max
    # one pool (a sequence takes only the cells it uses), or one KV stream of
    # n_ctx / n_seq_max cells per sequence (docs/multiseq.md)
    params.kv_unified = kv_unified
    params.n_threads = n_threads
    params.n_threads_batch = n_threads
    params.swa_full = swa_full
    params.type_k = type_k
    params.type_v = type_v
    params.no_perf = True
    if flash_attn is not None:
        params.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if flash_attn
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
    if capture is not None:  # flash attention is the caller's (CacheSettings): the
        # capture reads attention with it on (the fused node's inputs) or off
        params.cb_eval = capture.c_callback
        params.cb_eval_user_data = None
    params.abort_callback = abort.callback
    params.abort_callback_data = abort.data
    return params


def _open(
    model: Model, params: llama_cpp.llama_context_params, n_ctx: int
) -> _internals.LlamaContext:
    """The native context; ``OutOfMemoryError`` where llama.cpp cannot allocate its
    ``n_ctx`` cells."""
    try:
        return _internals.LlamaContext(model=model.native, params=params, verbose=False)
    except ValueError as exc:
        raise OutOfMemoryError(
            f"could not allocate a KV cache of {n_ctx} cells; try a smaller --budget"
        ) from exc


class NativeContext:
    """One llama.cpp context with a cache of ``n_ctx`` cells for ``n_seq_max``
    sequences (one pool of cells shared by all of them)."""

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        capture: Capture | None,
        flash_attn: bool | None = None,
        swa_full: bool = False,
        type_k: int = KV_TYPES["f16"],
        type_v: int = KV_TYPES["f16"],
        cancel_event: AbortEvent | None = None,
        n_seq_max: int = 1,
        kv_unified: bool = True,
        n_ubatch: int | None = None,
    ) -> None:
        """``swa_full``: sliding-window layers get ``n_ctx`` cells too (else window +
        ubatch, llama.cpp's default); ``type_k``/``type_v``: ggml types of the cache
        (a quantized V needs flash attention). ``n_batch``: the most tokens of one
        ``decode_batch``, which llama.cpp computes in ubatches of ``n_ubatch`` tokens
        (default: ``n_batch``, one ubatch a decode)."""
        n_ubatch = min(n_ubatch or n_batch, n_batch)
        one_blas_thread()
        self.model = model
        self.cancel_event = cancel_event or AbortEvent()
        self.settings = {
            "n_batch": n_batch,
            "n_threads": n_threads,
            "capture": capture,
            "flash_attn": flash_attn,
            "swa_full": swa_full,
            "type_k": type_k,
            "type_v": type_v,
            "cancel_event": self.cancel_event,
            "n_seq_max": n_seq_max,
            "kv_unified": kv_unified,
            "n_ubatch": n_ubatch,
        }
        self.n_seq_max = n_seq_max
        self.capture = capture
        self.attention = capture  # the capture a context resized with it gets back
        native = {k: v for k, v in self.settings.items() if k != "cancel_event"}
        params = _context_params(n_ctx, abort=self.cancel_event.flag, **native)  # type: ignore[arg-type]
        self._ctx = _open(model, params, n_ctx)
        self.n_ctx = self._ctx.n_ctx()
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self._ctx.ctx))
        self.kv_unified = kv_unified
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.swa_cells = self._swa_cells(swa_full)
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = model.info.n_vocab
        self._picked: int | None = None
        self._shift_pending = False  # llama.cpp applies a seq_shift at the next decode
        self._abort, self._aborts = "flag", self._abort_choices()
        self._pick_error: Exception | None = None

    def _swa_cells(self, swa_full: bool) -> int:
        """Cells of each sliding-window layer: none without such layers, ``n_ctx``
        with ``swa_full``, else what llama.cpp gives a window (per stream)."""
        info = self.model.info
        if not info.n_swa_layers:
            return 0
        if swa_full:
            return self.n_ctx
        if self.kv_unified:
            return swa_cells(self.n_ctx, info.n_swa, self.n_ubatch, self.n_seq_max)
        return swa_cells(self.n_ctx_seq, info.n_swa, self.n_ubatch) * self.n_seq_max

    def decode(
        self,
        tokens: Sequence[int],
        pos0: int,
        *,
        logits: bool,
        every: bool = False,
        capture: Segment | None = None,
        pick: Pick | None = None,
        seq: int = SEQ,
    ) -> Captured | None:
        """Decode ``tokens`` of sequence ``seq`` at positions ``pos0...``; logits for
        the last one if asked (for every one with ``every``). ``capture``: the
        attention and keys to keep (its ``start``/``stop`` are ignored: all the rows).
        ``pick``: run on the last row's logits where they lie (``picked``), none read out."""
        n = len(tokens)
        entries = [(seq, tok, pos0 + i, every) for i, tok in enumerate(tokens)]
        if n:
            entries[-1] = (seq, tokens[-1], pos0 + n - 1, logits or every or pick is not None)
        got, self._picked, self._pick_error = None, None, None
        if capture is None:
            self.decode_batch(entries)
        else:
            seg = Segment(0, n, capture.rows, capture.visibility, keys=capture.keys)
            got = self.decode_batch(entries, [seg])[0]
        if pick is not None:
            try:
                self._picked = pick(self.logits_view(-1))
            except Exception as exc:  # raised by ``picked``: the decode itself ran
                self._pick_error = exc
        return got

    def picked(self) -> int:
        """The token the last decode's ``pick`` chose (what it raised, raised here)."""
        return picked_token(self._picked, self._pick_error)

    def decode_batch(
        self,
        entries: Sequence[tuple[int, int, int, bool]],
        segments: Sequence[Segment] = (),
        n_streams: int = 1,
        *,
        ubatches: Sequence[Ubatch] = (),
    ) -> list[Captured]:
        """Decode ``(seq, token, position, wants_logits)`` entries in one
        ``llama_decode``; capture the attention of ``segments`` (rows of the batch,
        or with ``n_streams`` > 1 of each stream: see capture.py), or of the
        segments of each of the ``ubatches`` llama.cpp splits the batch into."""
        n = len(entries)
        if not 0 < n <= self.n_batch:
            raise EngineError(f"decode of {n} tokens does not fit a batch of {self.n_batch}")
        b = self._batch.batch
        b.n_tokens = n
        for i, (seq, tok, pos, out) in enumerate(entries):
            if not 0 <= seq < self.n_seq_max:
                raise EngineError(f"sequence {seq} is outside 0..{self.n_seq_max - 1}")
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = out
        if self.cancel_event.is_set():
            raise Cancelled("cancelled")
        self._choose_abort(n)
        armed = bool(segments or ubatches)
        got: list[Captured] = []
        if armed:
            if self.capture is None:
                raise EngineError("this context was made without attention capture")
            if ubatches:
                self.capture.arm_ubatches(ubatches)
            else:
                self.capture.arm(n // n_streams, segments, n_streams)
        with decoding(self.cancel_event):  # a cancel's abort is not logged as an error
            rc = llama_cpp.llama_decode(self._ctx.ctx, b)
        if armed and self.capture is not None:
            got = self.capture.take() if rc == 0 else self.capture.disarm()
        if rc == 0:
            self._shift_pending = False
            return got
        if rc == 2:
            raise Cancelled("cancelled")
        if rc == 1:
            raise CacheFullError("no free KV cell for the batch (the cache is full)")
        if rc == -2:
            raise OutOfMemoryError(
                "llama.cpp ran out of memory while decoding; try a smaller budget"
            )
        raise EngineError(f"llama_decode failed with code {rc}")

    def _abort_choices(self) -> dict[str, tuple[object, object]]:
        """What ``_choose_abort`` may set as llama.cpp's abort callback and its data
        (kept alive as long as the context); the context starts with the flag."""
        python = llama_cpp.ggml_abort_callback(lambda _data: self.cancel_event.is_set())
        return {
            "none": (_NO_ABORT, None),
            "python": (python, None),
            "flag": (_ggml.AbortFlag.callback, self.cancel_event.flag.data),
        }

    def _choose_abort(self, n: int) -> None:
        """What llama.cpp asks between graph nodes in this decode: nothing while a
        shift is pending (its graph rotates keys in place and, stopped halfway, would
        be applied again whole: corrupt keys); on the main thread, for a decode of
        more than ``PYTHON_ABORT_FROM`` tokens, a Python callback, since Python runs a
        Ctrl+C handler only there and between bytecodes; else the flag, in C."""
        if self._shift_pending:
            want = "none"
        elif n > PYTHON_ABORT_FROM and threading.current_thread() is threading.main_thread():
            want = "python"
        else:
            want = "flag"
        if want != self._abort:
            llama_cpp.llama_set_abort_callback(self._ctx.ctx, *self._aborts[want])
            self._abort = want

    def busy(self) -> contextlib.AbstractContextManager[object]:
        """Held around a session's CPU work between decodes; alone, nothing to share."""
        return contextlib.nullcontext()

    def rest(self) -> None:
        """No decode follows soon; alone, no batch waits for it."""

    @property
    def n_cells(self) -> int:
        """Cells of one sequence's cache (the columns of the attention tensor)."""
        return self.n_ctx if self.kv_unified else self.n_ctx_seq

    def logits_view(self, i: int) -> np.ndarray:
        """Logits of batch entry ``i`` of the last decode (it must have asked; -1: the
        last that did) in llama.cpp's own buffer: valid until the next decode."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx.ctx, i)
        if not ptr:
            raise EngineError(f"no logits for batch entry {i}")
        buf = (ctypes.c_float * self.n_vocab).from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(buf, dtype=np.float32, count=self.n_vocab)

    def logits_at(self, i: int) -> np.ndarray:
        """A copy of batch entry ``i``'s logits (see ``logits_view``)."""
        return self.logits_view(i).copy()

    def last_logits(self) -> np.ndarray:
        """Logits of the last decoded token that asked for them (float32, n_vocab)."""
        return self.logits_at(-1)

    def logits_rows(self, n: int) -> np.ndarray:
        """Logits of the last decode's ``n`` output rows (float32, ``(n, n_vocab)``)."""
        ptr = llama_cpp.llama_get_logits(self._ctx.ctx)
        if not ptr:
            raise EngineError("no logits available")
        size = n * self.n_vocab
        buf = (ctypes.c_float * size).from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(buf, dtype=np.float32, count=size).reshape(n, self.n_vocab).copy()

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:  # llama.cpp asserts (aborts) on a bad id
            raise EngineError(f"sequence {seq} is outside 0..{self.n_seq_max - 1}")

    def seq_rm(self, p0: int, p1: int, seq: int = SEQ) -> None:
        """Remove positions ``[p0, p1)`` (p1 < 0: to the end) from every layer."""
        self._check_seq(seq)
        if not self._ctx.kv_cache_seq_rm(seq, p0, p1):
            raise EngineError(f"llama.cpp refused to remove positions {p0}..{p1}")

    def seq_shift(self, p0: int, p1: int, delta: int, seq: int = SEQ) -> None:
        """Add ``delta`` to positions in ``[p0, p1)``; RoPE is re-applied later."""
        self._check_seq(seq)
        self._ctx.kv_cache_seq_shift(seq, p0, p1, delta)
        self._shift_pending = True

    def pos_max(self, seq: int = SEQ) -> int:
        self._check_seq(seq)
        return int(llama_cpp.llama_memory_seq_pos_max(self._ctx.memory, seq))

    def resized(
        self, n_ctx: int, *, capture: bool = True, flash_attn: bool | None
    ) -> NativeContext:
        """A new, empty context of ``n_ctx`` cells with the same settings (and the same
        cancel event, so a cancel during the swap is not lost) but ``flash_attn``;
        ``capture=False``: without the eval callback (no attention to read: llama.cpp
        then reuses its graphs and calls no Python per graph node)."""
        settings = {**self.settings, "capture": self.attention if capture else None}
        settings["flash_attn"] = flash_attn
        new = NativeContext(self.model, n_ctx=n_ctx, **settings)  # type: ignore[arg-type]
        new.attention = self.attention
        return new

    def save_seq(self) -> bytes:
        """The sequence's cells (positions, K and V) as llama.cpp serializes them.

        Pending position shifts are not applied by the save: call it only after a
        decode, never between ``seq_shift`` and the next decode."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, SEQ)
        buf = (ctypes.c_uint8 * size)()
        got = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buf, size, SEQ)
        if got == 0 and size:
            raise EngineError("llama.cpp could not save the sequence's cache")
        return ctypes.string_at(buf, got)  # one copy (slicing would build a list of ints)

    def load_seq(self, data: bytes) -> None:
        """Put a saved sequence into this (empty) context: its cells land in cells
        0..n-1 in the order they had in the old cache (llama.cpp's ``state_read``)."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if not llama_cpp.llama_state_seq_set_data(self._ctx.ctx, buf, len(data), SEQ):
            raise EngineError("llama.cpp could not restore the sequence into the larger cache")

    def clear(self) -> None:
        self._ctx.kv_cache_clear()

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()
