"""Synthetic GGUF models with the exact tensor shapes of popular models, for
measuring speed and memory on a GPU where the real weights cannot be carried.

Weights are random Q4_K/Q6_K blocks written directly (no floats are quantized): the
Q4_K_M mix of llama.cpp's ``llama-quantize`` (Q6_K for the output matrix and for
attn_v and ffn_down in the first and last eighth of the layers and every third one
between), so the file is within a few percent of the published Q4_K_M's size. Block
scales are set so each matrix product keeps unit variance (RMS-normalized inputs),
so attention is spread as in a trained model rather than saturated or flat. Speed
and memory do not depend on weight values; answers do, so quality figures come
from the real model on CPU, never from these.

The tokenizer is borrowed: the default model's SentencePiece vocabulary (Gemma 3,
262,144 pieces), cut or padded to each model's vocabulary size; a vocabulary-only
GGUF (a few MB) can be written here and carried where the default model is not.

    python scripts/gpu/synth_model.py vocab OUT.gguf
    python scripts/gpu/synth_model.py llama-3.1-8b OUT.gguf [--vocab FILE.gguf]
    python scripts/gpu/synth_model.py --list
"""

from __future__ import annotations

import argparse
import math
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

Q4_K_BYTES, Q6_K_BYTES, QK = 144, 210, 256  # bytes per block of 256 weights
POOL_BLOCKS = 4096  # distinct random blocks per (type, row length); tensors repeat them
FILE_TYPE_Q4_K_M = 15  # llama_ftype LLAMA_FTYPE_MOSTLY_Q4_K_M


@dataclass(frozen=True)
class Shape:
    """A model's hyperparameters as llama.cpp reads them (lengths in elements)."""

    arch: str  # "llama" or "gemma3"
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int = 131072
    rope_base: float = 500000.0
    rms_eps: float = 1e-5
    sliding_window: int = 0  # gemma3: every sixth layer is global, the rest see this many
    rope_scale: float = 0.0  # gemma3's linear scaling of the global layers
    published_bytes: int = 0  # the published Q4_K_M file, for comparison
    note: str = ""


SHAPES: dict[str, Shape] = {
    "llama-3.1-8b": Shape(
        "llama", 32, 4096, 32, 8, 128, 14336, 128256,
        published_bytes=4_920_739_232,
        note="Llama 3.1 8B: 32 layers, GQA 32 query / 8 KV heads of 128",
    ),
    "gemma-3-12b": Shape(
        "gemma3", 48, 3840, 16, 8, 256, 15360, 262208,
        rope_base=1_000_000.0, rms_eps=1e-6, sliding_window=1024, rope_scale=8.0,
        published_bytes=7_300_575_520,
        note="Gemma 3 12B: 48 layers (8 global, 40 with a 1,024-token window), 8 KV heads of 256",
    ),
    # the same structures, small enough for a CPU dry run
    "llama-tiny": Shape(
        "llama", 2, 256, 4, 2, 64, 512, 32000, n_ctx_train=32768, note="Llama structure, tiny"
    ),
    "gemma-tiny": Shape(
        "gemma3", 6, 256, 4, 2, 64, 512, 32000, n_ctx_train=32768, rope_base=1_000_000.0,
        rms_eps=1e-6, sliding_window=128, rope_scale=8.0, note="Gemma 3 structure, tiny",
    ),
}  # fmt: skip


def more_bits(i: int, n: int) -> bool:
    """llama-quantize's ``use_more_bits``: which layers Q4_K_M gives Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensors(s: Shape) -> Iterator[tuple[str, tuple[int, ...], Q]]:
    """(name, numpy shape (rows, row length), type) of every tensor, in file order."""
    q_dim, kv_dim = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    tied = s.arch == "gemma3"  # Gemma ties the output matrix to the embeddings
    yield "token_embd.weight", (s.n_vocab, s.n_embd), Q.Q6_K if tied else Q.Q4_K
    yield "output_norm.weight", (s.n_embd,), Q.F32
    if not tied:
        yield "output.weight", (s.n_vocab, s.n_embd), Q.Q6_K
    for i in range(s.n_layer):
        big = Q.Q6_K if more_bits(i, s.n_layer) else Q.Q4_K
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (s.n_embd,), Q.F32
        yield b + "attn_q.weight", (q_dim, s.n_embd), Q.Q4_K
        yield b + "attn_k.weight", (kv_dim, s.n_embd), Q.Q4_K
        yield b + "attn_v.weight", (kv_dim, s.n_embd), big
        yield b + "attn_output.weight", (s.n_embd, q_dim), Q.Q4_K
        if s.arch == "gemma3":
            yield b + "attn_q_norm.weight", (s.head_dim,), Q.F32
            yield b + "attn_k_norm.weight", (s.head_dim,), Q.F32
            yield b + "post_attention_norm.weight", (s.n_embd,), Q.F32
            yield b + "post_ffw_norm.weight", (s.n_embd,), Q.F32
        yield b + "ffn_norm.weight", (s.n_embd,), Q.F32
        yield b + "ffn_gate.weight", (s.n_ff, s.n_embd), Q.Q4_K
        yield b + "ffn_up.weight", (s.n_ff, s.n_embd), Q.Q4_K
        yield b + "ffn_down.weight", (s.n_embd, s.n_ff), big


def _f16(x: float) -> np.ndarray:
    return np.frombuffer(np.float16(x).tobytes(), np.uint8)


def block_pool(kind: Q, row: int, rng: np.random.Generator) -> np.ndarray:
    """``POOL_BLOCKS`` random blocks whose weights have mean 0 and standard
    deviation 1/sqrt(row): a product with a unit-variance input has unit variance."""
    want = 1.0 / math.sqrt(row)
    if kind == Q.Q4_K:  # d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 of nibbles
        pool = np.empty((POOL_BLOCKS, Q4_K_BYTES), np.uint8)
        d = want / math.sqrt((16**2 - 1) / 12)  # nibbles 0..15: sd 4.61
        pool[:, 0:2], pool[:, 2:4] = _f16(d), _f16(7.5 * d)  # w = d*q - 7.5*d
        pool[:, 4:12] = 1  # the 8 sub-blocks' scale and min, 1 each (low 6 bits)
        pool[:, 12:16] = 0x11  # the same for the packed upper four
        pool[:, 16:] = rng.integers(0, 256, (POOL_BLOCKS, 128), dtype=np.uint8)
    elif kind == Q.Q6_K:  # 128 bytes low nibbles, 64 high pairs, 16 int8 scales, d
        pool = np.empty((POOL_BLOCKS, Q6_K_BYTES), np.uint8)
        d = want / math.sqrt((64**2 - 1) / 12)  # 6-bit values minus 32: sd 18.5
        pool[:, :192] = rng.integers(0, 256, (POOL_BLOCKS, 192), dtype=np.uint8)
        pool[:, 192:208] = 1
        pool[:, 208:210] = _f16(d)
    else:
        raise ValueError(f"no block pool for {kind.name}")
    return pool


@dataclass(frozen=True)
class Vocab:
    """A SentencePiece vocabulary as GGUF stores it."""

    tokens: list[bytes]
    scores: np.ndarray  # float32
    types: np.ndarray  # int32, llama_token_type
    bos: int
    eos: int
    unk: int
    pad: int

    @classmethod
    def read(cls, path: Path) -> Vocab:
        kv = read_metadata(path)
        if kv.get("tokenizer.ggml.model") != "llama":
            raise ValueError(f"{path}: not a SentencePiece ('llama') vocabulary")
        ids = ("bos", "eos", "unknown", "padding")
        return cls(
            kv["tokenizer.ggml.tokens"],
            np.asarray(kv["tokenizer.ggml.scores"], np.float32),
            np.asarray(kv["tokenizer.ggml.token_type"], np.int32),
            *(int(kv[f"tokenizer.ggml.{k}_token_id"]) for k in ids),
        )

    def sized(self, n: int) -> Vocab:
        """The first ``n`` pieces, or all of them and ``<synth_i>`` control pieces."""
        extra = max(0, n - len(self.tokens))
        tokens = self.tokens[:n] + [f"<synth_{i}>".encode() for i in range(extra)]
        scores = np.concatenate([self.scores[:n], np.zeros(extra, np.float32)])
        control = int(gguf.TokenType.CONTROL)
        types = np.concatenate([self.types[:n], np.full(extra, control, np.int32)])
        return Vocab(tokens, scores, types, self.bos, self.eos, self.unk, self.pad)

    def add_to(self, w: gguf.GGUFWriter) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(self.tokens)
        w.add_token_scores(self.scores.tolist())
        w.add_token_types(self.types.tolist())
        w.add_bos_token_id(self.bos)
        w.add_eos_token_id(self.eos)
        w.add_unk_token_id(self.unk)
        w.add_pad_token_id(self.pad)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}  # GGUF value type: struct format
_STRING, _ARRAY = 8, 9


def read_metadata(path: Path) -> dict[str, object]:
    """A GGUF file's key/value metadata (not its tensors). gguf.GGUFReader parses
    every element of the 262,144-piece vocabulary into its own array (20 s on this
    CPU); this reads numeric arrays with numpy and strings as bytes (under 1 s)."""
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # the metadata sits at the start; tokenizers are a few MB
    if data[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    at = 24

    def string() -> bytes:
        nonlocal at
        (n,) = struct.unpack_from("<Q", data, at)
        at += 8 + n
        return data[at - n : at]

    def value(kind: int) -> object:
        nonlocal at
        if kind == _STRING:
            return string().decode("utf-8", "replace")
        if kind == _ARRAY:
            sub, n = struct.unpack_from("<IQ", data, at)
            at += 12
            if sub == _STRING:
                return [string() for _ in range(n)]
            dtype = np.dtype(_SCALARS[sub])
            out = np.frombuffer(data, dtype, n, at)
            at += n * dtype.itemsize
            return out
        fmt = _SCALARS[kind]
        (v,) = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return v

    kv: dict[str, object] = {}
    for _ in range(n_kv):
        key = string().decode()
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        kv[key] = value(kind)
    return kv


def _hparams(w: gguf.GGUFWriter, name: str, s: Shape) -> None:
    w.add_name(f"synthetic {name}")
    w.add_description(f"kvtrim synthetic model, random weights: {s.note}")
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.rms_eps)
    if s.arch == "llama":
        w.add_rope_dimension_count(s.head_dim)
    if s.sliding_window:
        w.add_sliding_window(s.sliding_window)
    if s.rope_scale:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(s.rope_scale)
    w.add_file_type(FILE_TYPE_Q4_K_M)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_model(name: str, out: Path, vocab: Vocab, seed: int = 0) -> int:
    """Writes the model; returns its size in bytes."""
    s = SHAPES[name]
    rng = np.random.default_rng(seed)
    plan = list(tensors(s))
    w = gguf.GGUFWriter(out, s.arch)
    _hparams(w, name, s)
    vocab.sized(s.n_vocab).add_to(w)
    for tname, shape, kind in plan:
        if kind == Q.F32:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), 4 * shape[0])
        else:
            rows, row = shape
            per = Q4_K_BYTES if kind == Q.Q4_K else Q6_K_BYTES
            nbytes = rows * (row // QK) * per
            w.add_tensor_info(tname, (rows, nbytes // rows), np.dtype(np.uint8), nbytes, kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pools: dict[tuple[Q, int], np.ndarray] = {}
    for _, shape, kind in plan:
        if kind == Q.F32:
            w.write_tensor_data(np.ones(shape, np.float32))  # RMS-norm gains
            continue
        rows, row = shape
        pool = pools.get((kind, row))
        if pool is None:
            pool = pools[(kind, row)] = block_pool(kind, row, rng)
        per = pool.shape[1]
        w.write_tensor_data(np.resize(pool.reshape(-1), rows * (row // QK) * per))
    w.close()
    return out.stat().st_size


def write_vocab(out: Path, vocab: Vocab) -> int:
    """A GGUF with the tokenizer alone (no tensors): what ``--vocab`` reads."""
    w = gguf.GGUFWriter(out, "vocab")
    vocab.add_to(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return out.stat().st_size


def _default_vocab_source() -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from engine.native.embedded import default_model_path

    return Path(default_model_path())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", nargs="?", help=f"'vocab' or a shape: {', '.join(SHAPES)}")
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument("--vocab", type=Path, help="GGUF to take the tokenizer from (default model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true", help="the shapes and their sizes")
    a = p.parse_args(argv)
    if a.list:
        for name, s in SHAPES.items():
            print(f"{name:14} {_planned_bytes(s) / 1e9:6.2f} GB  {s.note}")
        return 0
    if a.what is None or a.out is None or (a.what != "vocab" and a.what not in SHAPES):
        p.error(f"give 'vocab' or one of {', '.join(SHAPES)}, and an output file")
    start = time.perf_counter()
    try:
        vocab = Vocab.read(a.vocab or _default_vocab_source())
    except (OSError, ValueError, KeyError, struct.error) as exc:
        p.error(f"cannot read a vocabulary from {a.vocab}: {exc}")
    try:
        if a.what == "vocab":
            size = write_vocab(a.out, vocab)
        else:
            size = write_model(a.what, a.out, vocab, a.seed)
    except OSError as exc:  # a missing folder, a full disk: no half-written model left
        a.out.unlink(missing_ok=True)
        p.error(f"cannot write {a.out}: {exc}")
    secs = time.perf_counter() - start
    print(f"{a.out}: {a.what}, {size / 1e9:.3f} GB in {secs:.1f} s")
    published = SHAPES[a.what].published_bytes if a.what in SHAPES else 0
    if published:
        print(f"  published Q4_K_M: {published / 1e9:.3f} GB ({size / published - 1:+.1%})")
    return 0


def _planned_bytes(s: Shape) -> int:
    total = 0
    for _, shape, kind in tensors(s):
        if kind == Q.F32:
            total += 4 * shape[0]
        else:
            per = Q4_K_BYTES if kind == Q.Q4_K else Q6_K_BYTES
            total += shape[0] * (shape[1] // QK) * per
    return total


if __name__ == "__main__":
    sys.exit(main())
