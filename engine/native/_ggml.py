"""The only ctypes code of kvtrim's own: reading ggml tensors inside llama.cpp's
eval callback, and the callback types llama.cpp calls back into.

Offsets follow ``struct ggml_tensor`` in ggml.h on 64-bit platforms: ``type``
(int32) at 0, the buffer pointer at 8, ``ne[4]`` (int64 elements) at 16 and
``nb[4]`` (size_t bytes) at 48. Everything else goes through llama-cpp-python's
own bindings.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from collections.abc import Callable

import llama_cpp
import numpy as np
from llama_cpp import _ctypes_extensions

GGML_TYPE_F32 = 0
_NE_OFFSET = 16
_NB_OFFSET = 48

# the same library folder llama-cpp-python loads from (it honours LLAMA_CPP_LIB_PATH)
_libdir = pathlib.Path(
    os.environ.get("LLAMA_CPP_LIB_PATH") or pathlib.Path(llama_cpp.__file__).parent / "lib"
)
_base = _ctypes_extensions.load_shared_library("ggml-base", _libdir)

_base.ggml_get_name.argtypes = [ctypes.c_void_p]
_base.ggml_get_name.restype = ctypes.c_char_p
_base.ggml_backend_tensor_get.argtypes = [
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_size_t,
]
_base.ggml_backend_tensor_get.restype = None

EvalCallback = Callable[[int, bool, int | None], bool]
"""``(tensor_address, ask, user_data) -> bool``: ``ggml_backend_sched_eval_callback``."""


def tensor_name_bytes(tensor: int) -> bytes:
    """The tensor's name as bytes (the fast path inside the eval callback)."""
    return _base.ggml_get_name(tensor) or b""


def tensor_name(tensor: int) -> str:
    """The tensor's name, for example ``kq_soft_max-5``."""
    return tensor_name_bytes(tensor).decode("utf-8", "replace")


def tensor_type(tensor: int) -> int:
    """The tensor's ggml type id (0 is f32)."""
    return ctypes.c_int32.from_address(tensor).value


def tensor_shape(tensor: int) -> tuple[int, int, int, int]:
    """``ne``: element counts, innermost first (ggml order)."""
    ne = (ctypes.c_int64 * 4).from_address(tensor + _NE_OFFSET)
    return (ne[0], ne[1], ne[2], ne[3])


def tensor_strides(tensor: int) -> tuple[int, int, int, int]:
    """``nb``: strides in bytes, innermost first (ggml order)."""
    nb = (ctypes.c_size_t * 4).from_address(tensor + _NB_OFFSET)
    return (nb[0], nb[1], nb[2], nb[3])


def read_rows(tensor: int, row0: int, row1: int) -> np.ndarray:
    """Copy rows ``[row0, row1)`` of every head of an f32 attention tensor.

    ggml's ``ne`` is ``[n_kv, n_tokens, n_head, n_stream]``; the result is a
    float32 array of shape ``(n_stream * n_head, row1 - row0, n_kv)``. Rows are
    contiguous per head, so this is one ``ggml_backend_tensor_get`` per head (or
    one in all when every row is wanted), from whichever backend holds it.
    """
    n_kv, n_rows, n_head, n_stream = tensor_shape(tensor)
    nb0, nb1, nb2, nb3 = tensor_strides(tensor)
    if tensor_type(tensor) != GGML_TYPE_F32 or nb0 != 4 or nb1 != n_kv * 4:
        raise ValueError(f"{tensor_name(tensor)}: expected a contiguous f32 tensor")
    heads = n_head * n_stream
    count = row1 - row0
    out = np.empty((heads, count, n_kv), dtype=np.float32)
    if count == n_rows and nb2 == n_rows * nb1 and nb3 == n_head * nb2:
        _base.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
        return out
    row_bytes = count * nb1
    for s in range(n_stream):
        for h in range(n_head):
            dst = out[s * n_head + h]
            offset = s * nb3 + h * nb2 + row0 * nb1
            _base.ggml_backend_tensor_get(tensor, dst.ctypes.data, offset, row_bytes)
    return out


def read_keys(tensor: int, row0: int, row1: int) -> np.ndarray:
    """Copy tokens ``[row0, row1)`` of an f32 key tensor (``Kcur-<layer>``, ggml ``ne``
    ``[head_dim, n_head_kv, n_tokens]``) as float32 ``(row1 - row0, n_head_kv,
    head_dim)``: one ``ggml_backend_tensor_get``, the tokens being contiguous."""
    head_dim, n_head, _n_tokens, _ = tensor_shape(tensor)
    nb0, nb1, nb2, _ = tensor_strides(tensor)
    contiguous = nb0 == 4 and nb1 == head_dim * 4 and nb2 == n_head * nb1
    if tensor_type(tensor) != GGML_TYPE_F32 or not contiguous:
        raise ValueError(f"{tensor_name(tensor)}: expected a contiguous f32 tensor")
    out = np.empty((row1 - row0, n_head, head_dim), dtype=np.float32)
    _base.ggml_backend_tensor_get(tensor, out.ctypes.data, row0 * nb2, out.nbytes)
    return out


def make_eval_callback(fn: EvalCallback) -> llama_cpp.ggml_backend_sched_eval_callback:
    """Wrap ``fn(tensor, ask, user_data)`` as a C eval callback. It runs for every
    graph node of every decode, so it takes the C arguments as they are (no extra
    Python frame). Keep the result alive as long as the context."""
    return llama_cpp.ggml_backend_sched_eval_callback(fn)


def make_abort_callback(should_abort: Callable[[], bool]) -> llama_cpp.ggml_abort_callback:
    """Wrap ``should_abort`` as llama.cpp's abort callback (true stops the compute)."""

    def trampoline(_data: int | None) -> bool:
        return should_abort()

    return llama_cpp.ggml_abort_callback(trampoline)


def make_log_callback(sink: Callable[[int, str], None]) -> llama_cpp.llama_log_callback:
    """Wrap ``sink(level, text)`` as llama.cpp's log callback."""

    def trampoline(level: int, text: bytes | None, _data: int | None) -> None:
        if text:
            sink(level, text.decode("utf-8", "replace"))

    return llama_cpp.llama_log_callback(trampoline)


_base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
_base.ggml_row_size.restype = ctypes.c_size_t


def row_bytes(ggml_type: int, n_elements: int) -> int:
    """Bytes that ``n_elements`` values of ``ggml_type`` take (quantized types too)."""
    return int(_base.ggml_row_size(ggml_type, n_elements))
