"""The only ctypes code of kvtrim's own: reading ggml tensors inside llama.cpp's
eval callback, the callback types llama.cpp calls back into, and the abort flag
it reads without Python.

Offsets follow ``struct ggml_tensor`` in ggml.h on 64-bit platforms: ``type``
(int32) at 0, the buffer pointer at 8, ``ne[4]`` (int64 elements) at 16, ``nb[4]``
(size_t bytes) at 48, ``op`` (int32) at 80, ``op_params`` (64 bytes) at 84 and
``src[10]`` (pointers) at 152. Everything else goes through llama-cpp-python's own
bindings.
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
GGML_TYPE_F16 = 1
_NE_OFFSET = 16
_NB_OFFSET = 48
_OP_OFFSET = 80
_OP_PARAMS_OFFSET = 84
_SRC_OFFSET = 152
_N_SRC = 10
_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16}

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
_base.ggml_op_name.argtypes = [ctypes.c_int]
_base.ggml_op_name.restype = ctypes.c_char_p
_base.ggml_nbytes.argtypes = [ctypes.c_void_p]
_base.ggml_nbytes.restype = ctypes.c_size_t

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


def tensor_op(tensor: int) -> bytes:
    """The name of the operation that computes the tensor, e.g. ``FLASH_ATTN_EXT``."""
    return _base.ggml_op_name(ctypes.c_int32.from_address(tensor + _OP_OFFSET).value) or b""


def tensor_src(tensor: int, i: int) -> int:
    """The address of the tensor's ``i``-th source (0: none)."""
    if not 0 <= i < _N_SRC:
        raise IndexError(i)
    return ctypes.c_void_p.from_address(tensor + _SRC_OFFSET + 8 * i).value or 0


def op_params_f32(tensor: int, count: int) -> tuple[float, ...]:
    """The first ``count`` op parameters read as float32 (flash attention keeps its
    scale, ALiBi bias and logit softcap there)."""
    return tuple((ctypes.c_float * count).from_address(tensor + _OP_PARAMS_OFFSET))


def read_tensor(tensor: int) -> np.ndarray:
    """Copy an f32 or f16 tensor, view or not, as float32 in numpy order
    ``(ne3, ne2, ne1, ne0)``: one ``ggml_backend_tensor_get`` of the bytes its
    strides span, from whichever backend holds it, laid out by its strides."""
    ggml_type = tensor_type(tensor)
    dtype = _DTYPES.get(ggml_type)
    if dtype is None:
        raise ValueError(f"{tensor_name(tensor)}: type {ggml_type} is neither f32 nor f16")
    ne = tensor_shape(tensor)
    nb = tensor_strides(tensor)
    span = int(_base.ggml_nbytes(tensor))
    raw = np.empty(span, dtype=np.uint8)
    if span:
        _base.ggml_backend_tensor_get(tensor, raw.ctypes.data, 0, span)
    view = np.lib.stride_tricks.as_strided(
        raw.view(dtype),  # ggml's span is whole elements: strides are multiples of one
        shape=ne[::-1],
        strides=nb[::-1],
        writeable=False,
    )
    return view.astype(np.float32)


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


_base.ggml_is_empty.argtypes = [ctypes.c_void_p]
_base.ggml_is_empty.restype = ctypes.c_bool
_HEADER_BYTES = 512  # more than a ggml_tensor (336 bytes); only ``ne`` is read


class AbortFlag:
    """A stop llama.cpp can look at without calling into Python.

    llama.cpp asks its abort callback after every graph node (about 450 times a
    decode of Gemma 3 270M). A Python callback must take the GIL each time, and
    while another Python thread runs the decode waits for it: beside a busy Python
    thread a 256-token read took 2.06 s with one, 0.85 s with this flag
    (``scripts/research/abort_gil.py``, issue 37). Here the callback is ggml's own
    ``ggml_is_empty`` (C, no GIL) and its data a tensor header that only this flag
    writes: ``ne`` all 1 (not empty: go on), or ``ne[0]`` 0 once raised (empty: stop).
    """

    callback = llama_cpp.ggml_abort_callback(
        ctypes.cast(_base.ggml_is_empty, ctypes.c_void_p).value
    )

    def __init__(self) -> None:
        self._header = ctypes.create_string_buffer(_HEADER_BYTES)
        self._ne = (ctypes.c_int64 * 4).from_buffer(self._header, _NE_OFFSET)
        self._ne[:] = (1, 1, 1, 1)
        self.data = ctypes.c_void_p(ctypes.addressof(self._header))
        """``abort_callback_data``: keep this flag alive as long as the context."""

    def put(self, stop: bool) -> None:
        """Raise (``stop``) or lower the flag; a running decode stops at its next node."""
        self._ne[0] = 0 if stop else 1

    @property
    def raised(self) -> bool:
        return bool(_base.ggml_is_empty(self.data))


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
