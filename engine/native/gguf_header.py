"""The parts of a GGUF header llama.cpp asserts on, read before llama.cpp sees the file.

llama.cpp aborts the whole process (``GGML_ASSERT``) on some metadata instead of
failing the load: a ``block_count`` over ``LLAMA_MAX_LAYERS`` (512) or of 0 ended
``kvtrim ask`` with SIGABRT and nothing on stderr (issue 23). This module walks the
header (key-value pairs, then tensor infos) with bounds on every count and length,
and ``check`` refuses, in one line, what llama.cpp would abort on. Units: bytes for
offsets and lengths, layers for ``block_count``.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

LLAMA_MAX_LAYERS = 512  # llama-hparams.h: per-layer arrays are this long
_MAX_KEYS = 1 << 16  # key-value pairs; real models have tens
_MAX_TENSORS = 1 << 20
_MAX_DIMS = 4  # GGML_MAX_DIMS
_STRING, _ARRAY = 8, 9
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_UNSIGNED = {0: "<B", 2: "<H", 4: "<I", 10: "<Q"}
_SIGNED = {1: "<b", 3: "<h", 5: "<i", 11: "<q"}
_BLOCK = re.compile(r"blk\.(\d+)\.")


class HeaderError(ValueError):
    """The header is cut short or holds a count or length no real file has."""


@dataclass
class Header:
    """Integer metadata by key, and the tensors' names."""

    ints: dict[str, int] = field(default_factory=dict)
    tensors: list[str] = field(default_factory=list)

    @property
    def arch(self) -> str | None:
        return self.strings.get("general.architecture")

    strings: dict[str, str] = field(default_factory=dict)


class _Cursor:
    """Reads little-endian values from ``buf`` at ``at``, never past its end."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.at = buf, 0

    def take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.buf):
            raise HeaderError("it is truncated: its header ends early")
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return int(value)

    def skip(self, n: int) -> None:
        if n < 0 or self.at + n > len(self.buf):
            raise HeaderError("it is truncated: its header ends early")
        self.at += n

    def string(self, keep: bool) -> str:
        n = self.take("<Q")
        start = self.at
        self.skip(n)
        return bytes(self.buf[start : self.at]).decode("utf-8", "replace") if keep else ""


def _value(cur: _Cursor, vtype: int, key: str, head: Header) -> None:
    """Read (integers, short strings) or skip the value of ``key``."""
    if vtype in _UNSIGNED or vtype in _SIGNED:
        head.ints[key] = cur.take(_UNSIGNED.get(vtype) or _SIGNED[vtype])
    elif vtype in _SCALAR_BYTES:
        cur.skip(_SCALAR_BYTES[vtype])
    elif vtype == _STRING:
        text = cur.string(keep=key.startswith("general."))
        if text:
            head.strings[key] = text
    elif vtype == _ARRAY:
        item, n = cur.take("<I"), cur.take("<Q")
        if item == _STRING:
            for _ in range(n):
                cur.skip(cur.take("<Q"))
        elif item in _SCALAR_BYTES:
            cur.skip(n * _SCALAR_BYTES[item])
        else:  # arrays of arrays: no model writes them
            raise HeaderError(f"its metadata {key!r} is an array of type {item}")
    else:
        raise HeaderError(f"its metadata {key!r} has an unknown value type {vtype}")


def read(path: Path) -> Header:
    """The integer metadata and tensor names of the GGUF at ``path``."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur, head = _Cursor(buf), Header()
        cur.skip(8)  # magic and version
        n_tensors, n_keys = cur.take("<Q"), cur.take("<Q")
        if n_keys > _MAX_KEYS or n_tensors > _MAX_TENSORS:
            raise HeaderError(
                f"its header declares {n_keys:,} metadata keys and {n_tensors:,} tensors"
            )
        for _ in range(n_keys):
            key = cur.string(keep=True)
            _value(cur, cur.take("<I"), key, head)
        for _ in range(n_tensors):
            head.tensors.append(cur.string(keep=True))
            dims = cur.take("<I")
            if dims > _MAX_DIMS:
                raise HeaderError(f"its tensor {head.tensors[-1]!r} has {dims} dimensions")
            cur.skip(8 * dims + 4 + 8)  # shape, type, offset
        return head


def check(path: Path) -> str | None:
    """What in the header would make llama.cpp abort rather than fail, or None."""
    try:
        head = read(path)
    except HeaderError as exc:
        return str(exc)
    arch = head.arch
    blocks = head.ints.get(f"{arch}.block_count") if arch else None
    if blocks is None:
        return None  # llama.cpp refuses that itself, with an error
    found = {int(m.group(1)) for name in head.tensors if (m := _BLOCK.match(name))}
    if not 0 < blocks <= LLAMA_MAX_LAYERS:
        return f"it declares {blocks:,} layers (llama.cpp takes 1 to {LLAMA_MAX_LAYERS})"
    if found and max(found) + 1 != blocks:
        return f"it declares {blocks:,} layers but holds tensors for {max(found) + 1:,}"
    return None
