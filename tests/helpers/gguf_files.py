"""Copies of a GGUF model file with metadata changed: walks the key-value fields
directly (``u64``, ``skip_value``), as ``gguf_with_template`` does to write another
chat template into a copy of the default model."""

from __future__ import annotations

import mmap
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUFReader, GGUFValueType, Keys, TokenType

_SCALAR_BYTES = {t: np.dtype(d).itemsize for t, d in GGUFReader.gguf_scalar_to_np.items()}


def u64(buf: mmap.mmap, at: int) -> int:
    return struct.unpack_from("<Q", buf, at)[0]


def skip_value(buf: mmap.mmap, at: int, vtype: int) -> int:
    """The offset just after the GGUF value of ``vtype`` that starts at ``at``."""
    if vtype == GGUFValueType.STRING:
        return at + 8 + u64(buf, at)
    if vtype == GGUFValueType.ARRAY:
        item, n = struct.unpack_from("<IQ", buf, at)
        at += 12
        if item in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            for _ in range(n):
                at = skip_value(buf, at, item)
            return at
        return at + n * _SCALAR_BYTES[GGUFValueType(item)]
    return at + _SCALAR_BYTES[GGUFValueType(vtype)]


def _string_kv(key: str, value: str | bytes) -> bytes:
    k, v = key.encode(), value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", GGUFValueType.STRING, len(v)) + v


def _renamed_tokens(
    buf: mmap.mmap, kv: tuple[int, int, int], types_at: int, tags: Sequence[str]
) -> bytes:
    """The token list's key-value bytes with ``tags`` over the first ``<unused...>``
    control tokens; ``types_at``: where the token types (int32) start."""
    start, value, end = kv
    parts: list[bytes] = [buf[start : value + 12]]  # key, type, item type, count
    at, index, todo = value + 12, 0, list(tags)
    while todo:
        size = u64(buf, at)
        text = buf[at + 8 : at + 8 + size]
        if text.startswith(b"<unused"):
            (kind,) = struct.unpack_from("<i", buf, types_at + 4 * index)
            assert kind == TokenType.CONTROL, f"{text!r} is not a control token"
            tag = todo.pop(0).encode()
            parts.append(struct.pack("<Q", len(tag)) + tag)
        else:
            parts.append(buf[at : at + 8 + size])
        at, index = at + 8 + size, index + 1
    parts.append(buf[at:end])
    return b"".join(parts)


def gguf_with_template(
    src: Path, dst: Path, template: str | bytes, tags: Sequence[str] = ()
) -> None:
    """Copy ``src`` to ``dst`` with ``tokenizer.chat_template`` set to ``template`` and
    ``tags`` written over the first unused control tokens; every other key-value
    field, the tensor infos and the tensor data are copied byte for byte.

    Copying through gguf's GGUFReader and GGUFWriter, as its gguf_new_metadata script
    does, took 28-50 s a copy here (the reader makes an array view per string of the
    262,144-token vocabulary); the layout is walked directly instead, with gguf's
    constants and value sizes: under a second, most of it the tensor data's write."""
    with src.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        magic, version, n_tensors, n_kv = struct.unpack_from("<IIQQ", buf, 0)
        assert (magic, version) == (GGUF_MAGIC, 3), "a little-endian GGUF v3 file"
        fields: dict[str, tuple[int, int, int]] = {}  # key: start, value start, end
        at = 24
        for _ in range(n_kv):
            start, size = at, u64(buf, at)
            key = buf[at + 8 : at + 8 + size].decode()
            (vtype,) = struct.unpack_from("<I", buf, at + 8 + size)
            value = at + 12 + size
            at = skip_value(buf, value, vtype)
            fields[key] = (start, value, at)
        kv_end = at
        for _ in range(n_tensors):  # name, n_dims, dims, type, offset
            at = skip_value(buf, at, GGUFValueType.STRING)
            (n_dims,) = struct.unpack_from("<I", buf, at)
            at += 4 + 8 * n_dims + 4 + 8
        infos_end = at
        align = GGUF_DEFAULT_ALIGNMENT
        if Keys.General.ALIGNMENT in fields:
            align = struct.unpack_from("<I", buf, fields[Keys.General.ALIGNMENT][1])[0]
        data_start = -(-infos_end // align) * align

        kvs: list[bytes] = []
        for key, kv in fields.items():
            if key == Keys.Tokenizer.CHAT_TEMPLATE:
                continue
            if key == Keys.Tokenizer.LIST and tags:
                types_at = fields[Keys.Tokenizer.TOKEN_TYPE][1] + 12
                kvs.append(_renamed_tokens(buf, kv, types_at, tags))
            else:
                kvs.append(buf[kv[0] : kv[2]])
        kvs.append(_string_kv(Keys.Tokenizer.CHAT_TEMPLATE, template))
        head = b"".join(
            [struct.pack("<IIQQ", magic, version, n_tensors, len(kvs)), *kvs, buf[kv_end:infos_end]]
        )
        with dst.open("wb") as out:
            out.write(head + bytes(-len(head) % align))
            f.seek(data_start)
            shutil.copyfileobj(f, out, 1 << 24)
