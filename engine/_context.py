"""The native llama.cpp context of one session: creation, decode and KV edits.

A thin owner of native handles: C return codes become exceptions here, and the
eval and abort callbacks are kept alive as long as the context is.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence

import llama_cpp
import numpy as np
from llama_cpp import _internals

from . import _ggml
from .capture import AttentionCapture
from .errors import Cancelled, EngineError, OutOfMemoryError
from .model import Model

SEQ = 0


class NativeContext:
    """One llama.cpp context with a cache of ``n_ctx`` cells for sequence 0."""

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        capture: AttentionCapture | None,
        flash_attn: bool | None = None,
    ) -> None:
        self.model = model
        self.capture = capture
        self.cancel_event = threading.Event()
        self._abort_cb = _ggml.make_abort_callback(self.cancel_event.is_set)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.swa_full = True  # removing and shifting positions needs the full SWA cache
        params.no_perf = True
        if flash_attn is not None:
            params.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
                if flash_attn
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        if capture is not None:
            # the attention probabilities exist only without flash attention
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            params.cb_eval = capture.c_callback
            params.cb_eval_user_data = None
        params.abort_callback = self._abort_cb
        params.abort_callback_data = None
        try:
            self._ctx = _internals.LlamaContext(model=model.native, params=params, verbose=False)
        except ValueError as exc:
            raise OutOfMemoryError(
                f"could not allocate a KV cache of {n_ctx} cells; try a smaller --budget"
            ) from exc
        self.n_ctx = self._ctx.n_ctx()
        self.n_batch = n_batch
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        self.n_vocab = model.info.n_vocab

    def decode(
        self,
        tokens: Sequence[int],
        pos0: int,
        *,
        logits: bool,
        every: bool = False,
    ) -> None:
        """Decode ``tokens`` at positions ``pos0...``; logits for the last one if asked
        (for every one with ``every``)."""
        n = len(tokens)
        if not 0 < n <= self.n_batch:
            raise EngineError(f"decode of {n} tokens does not fit a batch of {self.n_batch}")
        b = self._batch.batch
        b.n_tokens = n
        for i, tok in enumerate(tokens):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = SEQ
            b.logits[i] = every
        b.logits[n - 1] = logits or every
        if self.cancel_event.is_set():
            raise Cancelled("cancelled")
        rc = llama_cpp.llama_decode(self._ctx.ctx, b)
        if rc == 0:
            return
        if rc == 2:
            raise Cancelled("cancelled")
        if rc == 1:
            raise EngineError("no free KV cell for the batch (the cache is full)")
        if rc == -2:
            raise OutOfMemoryError(
                "llama.cpp ran out of memory while decoding; try a smaller budget"
            )
        raise EngineError(f"llama_decode failed with code {rc}")

    def last_logits(self) -> np.ndarray:
        """Logits of the last decoded token that asked for them (float32, n_vocab)."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx.ctx, -1)
        if not ptr:
            raise EngineError("no logits available")
        buf = (ctypes.c_float * self.n_vocab).from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(buf, dtype=np.float32, count=self.n_vocab).copy()

    def logits_rows(self, n: int) -> np.ndarray:
        """Logits of the last decode's ``n`` output rows (float32, ``(n, n_vocab)``)."""
        ptr = llama_cpp.llama_get_logits(self._ctx.ctx)
        if not ptr:
            raise EngineError("no logits available")
        size = n * self.n_vocab
        buf = (ctypes.c_float * size).from_address(ctypes.addressof(ptr.contents))
        return np.frombuffer(buf, dtype=np.float32, count=size).reshape(n, self.n_vocab).copy()

    def seq_rm(self, p0: int, p1: int) -> None:
        """Remove positions ``[p0, p1)`` (p1 < 0: to the end) from every layer."""
        if not self._ctx.kv_cache_seq_rm(SEQ, p0, p1):
            raise EngineError(f"llama.cpp refused to remove positions {p0}..{p1}")

    def seq_shift(self, p0: int, p1: int, delta: int) -> None:
        """Add ``delta`` to positions in ``[p0, p1)``; RoPE is re-applied later."""
        self._ctx.kv_cache_seq_shift(SEQ, p0, p1, delta)

    def pos_max(self) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self._ctx.memory, SEQ))

    def clear(self) -> None:
        self._ctx.kv_cache_clear()

    def close(self) -> None:
        self._batch.close()
        self._ctx.close()
