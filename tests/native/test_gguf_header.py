"""The GGUF header walk that runs before llama.cpp sees a model file (issue 23,
FAIL 4: a block_count llama.cpp aborts on). Synthetic headers, no model."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from engine.native import gguf_header

U32, STRING, ARRAY = 4, 8, 9


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _gguf(
    path: Path, kv: list[tuple[str, int, bytes]], tensors: list[str], *, n_keys: int | None = None
) -> Path:
    body = b"GGUF" + struct.pack("<I", 3)
    body += struct.pack("<QQ", len(tensors), len(kv) if n_keys is None else n_keys)
    for key, vtype, value in kv:
        body += _s(key) + struct.pack("<I", vtype) + value
    for name in tensors:
        body += _s(name) + struct.pack("<I", 2) + struct.pack("<QQ", 4, 4)
        body += struct.pack("<IQ", 0, 0)  # type, offset
    path.write_bytes(body)
    return path


def _model(tmp_path: Path, blocks: int, layers: int, **kw: int) -> Path:
    kv = [
        ("general.architecture", STRING, _s("gemma3")),
        ("general.name", STRING, _s("tiny")),
        (
            "tokenizer.ggml.tokens",
            ARRAY,
            struct.pack("<IQ", STRING, 3) + _s("a") + _s("b") + _s(""),
        ),
        ("tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", 6, 3) + b"\0" * 12),
        ("gemma3.block_count", U32, struct.pack("<I", blocks)),
    ]
    tensors = ["token_embd.weight"] + [f"blk.{i}.attn_q.weight" for i in range(layers)]
    return _gguf(tmp_path / "m.gguf", kv, tensors, **kw)


def test_a_sound_header_is_read(tmp_path):
    head = gguf_header.read(_model(tmp_path, 18, 18))
    assert head.arch == "gemma3" and head.ints["gemma3.block_count"] == 18
    assert len(head.tensors) == 19 and head.tensors[1] == "blk.0.attn_q.weight"


@pytest.mark.parametrize(
    ("blocks", "layers", "message"),
    [
        (1000, 18, "declares 1,000 layers (llama.cpp takes 1 to 512)"),
        (0, 18, "declares 0 layers"),
        (17, 18, "declares 17 layers but holds tensors for 18"),
        (19, 18, "declares 19 layers but holds tensors for 18"),
    ],
)
def test_layer_counts_llama_cpp_aborts_on_are_refused(tmp_path, blocks, layers, message):
    assert message in (gguf_header.check(_model(tmp_path, blocks, layers)) or "")


def test_the_right_count_passes(tmp_path):
    assert gguf_header.check(_model(tmp_path, 18, 18)) is None


@pytest.mark.parametrize("cut", [10, 30, 60, 120, -20])
def test_a_cut_header_is_one_line_not_an_exception(tmp_path, cut):
    path = _model(tmp_path, 18, 18)
    path.write_bytes(path.read_bytes()[:cut])
    assert "it is truncated" in (gguf_header.check(path) or "")


def test_absurd_counts_are_refused_before_any_walk(tmp_path):
    path = _model(tmp_path, 18, 18, n_keys=2**40)
    assert "declares" in (gguf_header.check(path) or "")
