"""Model metadata no real model has (issue 23 WEAK: context_length 0 or 4294967295,
sliding_window 4294967295): one line about the model, not "budget + chunk (1280) must
be below 0" or "cell map lost track". Copies of the default model with one value
patched in place."""

from __future__ import annotations

import mmap
import shutil
import struct

import pytest
from helpers.gguf_files import skip_value as _skip
from helpers.gguf_files import u64 as _u64

from engine import Engine, ModelError
from engine.native.embedded import default_model_path

pytestmark = pytest.mark.slow


def _patched(dst, key: str, value: int):
    """A copy of the default model with the uint32 ``key`` set to ``value``."""
    shutil.copyfile(default_model_path(), dst)
    with dst.open("r+b") as f, mmap.mmap(f.fileno(), 0) as buf:
        n_kv = struct.unpack_from("<Q", buf, 16)[0]
        at = 24
        for _ in range(n_kv):
            size = _u64(buf, at)
            name = buf[at + 8 : at + 8 + size].decode()
            (vtype,) = struct.unpack_from("<I", buf, at + 8 + size)
            if name == key:
                assert vtype == 4, "a uint32"
                struct.pack_into("<I", buf, at + 12 + size, value)
                return dst
            at = _skip(buf, at + 12 + size, vtype)
    raise AssertionError(f"{key} not found")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("gemma3.context_length", 0, "trained context length is 0 tokens"),
        ("gemma3.context_length", 4294967295, "trained context length is"),
        ("gemma3.attention.sliding_window", 4294967295, "sliding window is"),
    ],
)
def test_implausible_metadata_is_one_line_about_the_model(tmp_path, key, value, message):
    path = _patched(tmp_path / "patched.gguf", key, value)
    with pytest.raises(ModelError) as caught:
        Engine(path)
    text = str(caught.value)
    assert message in text and "corrupt or badly edited" in text and str(path) in text


@pytest.mark.parametrize(
    ("value", "message"),
    [(1000, "declares 1,000 layers"), (0, "declares 0 layers"), (17, "holds tensors for 18")],
)
def test_a_layer_count_llama_cpp_aborts_on_is_one_line(tmp_path, value, message):
    """Issue 23, FAIL 4: block_count 1000 (or 0) ended the process with SIGABRT and
    nothing on stderr; now it is refused before llama.cpp reads the file."""
    path = _patched(tmp_path / "blocks.gguf", "gemma3.block_count", value)
    with pytest.raises(ModelError) as caught:
        Engine(path)
    text = str(caught.value)
    assert message in text and "corrupt or badly edited" in text and str(path) in text
