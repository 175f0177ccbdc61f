"""Loading a GGUF model: the embedded default, checks with clear errors, and the
facts the eviction layer needs (layers, KV sizes, which layers are global)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from llama_cpp import _internals

from ..errors import ModelError
from . import _ggml, crashlog, gguf_header
from .cpu import CpuPath, gpu_backends, resolve_repack, system_info
from .embedded import resolve
from .kvmemory import KVLayout, layout

log = logging.getLogger("kvtrim.llama")
log.setLevel(logging.ERROR)  # llama.cpp is chatty; --verbose lowers this

_GGUF_MAGIC = b"GGUF"
_GGUF_HEADER_BYTES = 24  # magic, version, tensor count, metadata count
_GGML_F16 = 1

# Sliding-window architectures: (pattern n, dense_first), as llama.cpp's
# load_swa_pattern() sets them when the GGUF carries no explicit pattern.
_SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "gemma-embedding": (6, False),
    "cohere2": (4, False),
    "llama4": (4, False),
    "olmo2": (4, False),
    "exaone4": (4, False),
    "openai-moe": (2, False),
    "gpt-oss": (2, False),
}

# enum ggml_log_level (ggml.h): NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


# What llama.cpp logs at ERROR when our abort callback stops a decode (a cancel):
# ggml's GGML_STATUS_ABORTED is 1, and llama_decode returns 2 for "aborted".
# A stop is not an error, so these lines are dropped while their decode's cancel
# is set; any other status still reaches the log.
_ABORT_LINES = re.compile(
    r"graph_compute: ggml_backend_sched_graph_compute_async failed with error 1"
    r"|process_ubatch: failed to compute graph, compute status: 1"
    r"|llama_decode: failed to decode, ret = 2"
)


class _LlamaLog:
    """Routes llama.cpp's log lines into Python logging (``kvtrim.llama``)."""

    def __init__(self) -> None:
        self._level = logging.INFO
        self._buffer = ""
        self._decoding = threading.local()  # .cancel: the running decode's cancel event
        self.c_callback = _ggml.make_log_callback(self._sink)
        llama_cpp.llama_log_set(self.c_callback, None)

    @contextlib.contextmanager
    def decoding(self, cancel: threading.Event) -> Iterator[None]:
        """Around a ``llama_decode`` on this thread: once ``cancel`` is set, the
        lines llama.cpp logs for the abort it causes are not errors."""
        outer = getattr(self._decoding, "cancel", None)
        self._decoding.cancel = cancel
        try:
            yield
        finally:
            self._decoding.cancel = outer

    @contextlib.contextmanager
    def collected(self) -> Iterator[list[str]]:
        """Around a native call whose failure the caller handles (a saved cache
        loaded): llama.cpp's lines from this thread go into the list it yields,
        not to the log, so none lands in the middle of an answer on the terminal."""
        outer = getattr(self._decoding, "lines", None)
        self._decoding.lines = lines = []
        try:
            yield lines
        finally:
            self._decoding.lines = outer

    def _cancelling(self) -> bool:
        cancel = getattr(self._decoding, "cancel", None)
        return cancel is not None and cancel.is_set()

    def _sink(self, level: int, text: str) -> None:
        if level != 5:  # 5 continues the previous line
            self._level = _LEVELS.get(level, logging.INFO)
        self._buffer += text
        if self._buffer.endswith("\n"):
            line, self._buffer = self._buffer.rstrip("\n"), ""
            if _ABORT_LINES.fullmatch(line.strip()) and self._cancelling():
                return
            lines = getattr(self._decoding, "lines", None)
            if lines is not None:
                lines.append(line.strip())
                return
            if log.isEnabledFor(self._level):
                log.log(self._level, "%s", line)


_llama_log = _LlamaLog()
decoding = _llama_log.decoding
collected_log = _llama_log.collected


def check_gguf(path: Path) -> None:
    """Fail with a one-line message unless ``path`` looks like a GGUF file."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"model path is not a file: {path}")
    size = path.stat().st_size
    if size == 0:
        raise ModelError(f"model file is empty: {path}")
    try:
        with path.open("rb") as f:
            head = f.read(_GGUF_HEADER_BYTES)
    except OSError as exc:
        raise ModelError(f"cannot read model file {path}: {exc.strerror}") from exc
    if not head.startswith(_GGUF_MAGIC):
        raise ModelError(f"not a GGUF model file: {path}")
    if len(head) < _GGUF_HEADER_BYTES:
        raise ModelError(f"model file is truncated: {path}")


_PIECE_CHARS = 1 << 20  # long texts are tokenized in pieces of about this many characters


def _pieces(text: str, size: int) -> Iterator[str]:
    """``text`` in pieces of about ``size`` characters, each cut just before a space
    that follows a non-space, where no token of a word-start vocabulary spans the
    cut. Bounds the tokenizer's memory: about 55 bytes per byte of text at once."""
    at = 0
    while len(text) - at > size:
        cut = text.find(" ", at + size)
        while cut > 0 and text[cut - 1].isspace():
            cut = text.find(" ", cut + 1)
        if cut <= 0:
            break
        yield text[at:cut]
        at = cut
    if at < len(text):
        yield text[at:]


@dataclass(frozen=True)
class ModelInfo:
    """What the eviction layer needs to know about a model."""

    path: str
    name: str
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    n_swa: int
    global_layers: tuple[int, ...]
    chat_template: str | None
    n_vocab: int

    def kv_bytes_per_cell(self, type_k: int = _GGML_F16, type_v: int = _GGML_F16) -> int:
        """KV bytes one cell (one position) takes over all layers (units: bytes)."""
        return self.kv_layout(type_k, type_v).cell_bytes

    @property
    def n_swa_layers(self) -> int:
        """Sliding-window layers (0 when the model has none or kvtrim cannot tell which)."""
        if self.n_swa <= 0 or not self.global_layers:
            return 0
        return self.n_layer - len(self.global_layers)

    def kv_layout(self, type_k: int = _GGML_F16, type_v: int = _GGML_F16) -> KVLayout:
        """Bytes per cell of the global and the sliding-window layers (see kvmemory.py)."""
        return layout(
            self.n_layer,
            self.n_swa_layers,
            self.n_swa,
            self.n_head_kv * self.head_dim_k,
            self.n_head_kv * self.head_dim_v,
            type_k,
            type_v,
        )


def _global_layers(arch: str, meta: dict[str, str], n_layer: int, n_swa: int) -> tuple[int, ...]:
    if n_swa <= 0:
        return tuple(range(n_layer))
    raw = meta.get(f"{arch}.attention.sliding_window_pattern")
    n, dense_first = _SWA_PATTERNS.get(arch, (0, False))
    if raw is not None and raw.strip().isdigit():
        n = int(raw)
    if n <= 0:
        return ()
    if dense_first:
        return tuple(il for il in range(n_layer) if il % n == 0)
    return tuple(il for il in range(n_layer) if il % n == n - 1)


MAX_TRAINED_CONTEXT = 1 << 24  # tokens; the longest trained contexts are 10M


def _implausible(info: ModelInfo) -> str | None:
    """What in the metadata no real model has (a 32-bit value that wrapped, a zero)."""
    if not 0 < info.n_ctx_train <= MAX_TRAINED_CONTEXT:
        return f"its trained context length is {info.n_ctx_train:,} tokens"
    if info.n_swa < 0 or info.n_swa > info.n_ctx_train:
        return f"its sliding window is {info.n_swa:,} tokens (trained context {info.n_ctx_train:,})"
    return None


_PUNCTUATION = frozenset(b".,;:!?)]}'\"")  # what may close a word


class Model:
    """A loaded GGUF: tokenizer, metadata and the native model handle."""

    def __init__(
        self,
        path: Path | str | None = None,
        *,
        n_gpu_layers: int = 0,
        repack: str | None = None,
    ) -> None:
        """``path``: a GGUF file or an embedded model's short name (embedded.py; None:
        the default). ``repack``: auto/on/off for llama.cpp's CPU weight repacking (see cpu.py);
        None reads ``$KVTRIM_REPACK``."""
        self.cpu_path: CpuPath = resolve_repack(repack)
        self._edges: dict[int, tuple[bool, bool, bool]] = {}
        model_path = resolve(path)
        check_gguf(model_path)
        why = gguf_header.check(model_path)  # what llama.cpp would abort on, not fail
        if why is not None:
            raise ModelError(f"{model_path}: {why}; the file is corrupt or badly edited")
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.use_extra_bufts = self.cpu_path.repack
        crashlog.phase(f"{crashlog.LOADING}{model_path}")  # an abort here: a bad file
        try:
            self._model = _internals.LlamaModel(
                path_model=str(model_path), params=params, verbose=False
            )
        except (ValueError, OSError) as exc:
            raise ModelError(
                f"llama.cpp could not load {model_path} (corrupt or unsupported)"
            ) from exc
        finally:
            crashlog.phase(crashlog.RUNNING)
        self.n_gpu_layers = n_gpu_layers
        try:
            self.info = self._read_info(model_path)
        except UnicodeDecodeError as exc:  # llama-cpp-python decodes metadata strictly
            self.close()
            raise ModelError(
                f"{model_path} holds metadata that is not UTF-8 text (byte {exc.start} of a "
                "value): corrupt or badly edited"
            ) from None
        why = _implausible(self.info)
        if why is not None:
            self.close()
            raise ModelError(f"{model_path}: {why}; the file is corrupt or badly edited")
        self.gpu_offload = bool(llama_cpp.llama_supports_gpu_offload())

    @property
    def on_gpu(self) -> bool:
        """Whether some layers run on a GPU (``n_gpu_layers`` -1: every one)."""
        return self.n_gpu_layers != 0 and self.gpu_offload

    @property
    def device_note(self) -> str | None:
        """Why GPU layers asked for are not used, or None when they are (or none asked)."""
        if self.n_gpu_layers > 0 and not self.gpu_offload:
            backends = gpu_backends(system_info())
            if backends:  # a GPU build on a machine without a usable GPU or driver
                return (
                    f"{self.n_gpu_layers} GPU layers asked for, but this {'/'.join(backends)} "
                    "build of llama.cpp found no usable GPU (no device, or its driver is "
                    "missing or too old): the model runs on the CPU"
                )
            return (
                f"{self.n_gpu_layers} GPU layers asked for, but this llama.cpp build has no "
                "GPU support: the model runs on the CPU"
            )
        return None

    def _read_info(self, path: Path) -> ModelInfo:
        m = self._model.model
        meta = self._model.metadata()
        arch = meta.get("general.architecture", "unknown")
        n_layer = llama_cpp.llama_model_n_layer(m)
        n_head = llama_cpp.llama_model_n_head(m)
        n_head_kv = llama_cpp.llama_model_n_head_kv(m)
        head_dim = llama_cpp.llama_model_n_embd(m) // max(n_head, 1)
        n_swa = llama_cpp.llama_model_n_swa(m)
        template = llama_cpp.llama_model_chat_template(m, None)
        return ModelInfo(
            path=str(path),
            name=meta.get("general.name", path.stem),
            arch=arch,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim_k=int(meta.get(f"{arch}.attention.key_length", head_dim)),
            head_dim_v=int(meta.get(f"{arch}.attention.value_length", head_dim)),
            n_ctx_train=self._model.n_ctx_train(),
            n_swa=n_swa,
            global_layers=_global_layers(arch, meta, n_layer, n_swa),
            chat_template=template.decode("utf-8", "replace") if template else None,
            n_vocab=self._model.n_vocab(),
        )

    @property
    def native(self) -> _internals.LlamaModel:
        return self._model

    def tokenize(
        self, text: str, *, add_bos: bool = False, markup: Sequence[tuple[int, int]] = ()
    ) -> list[int]:
        """Token ids of ``text``, read as plain text: ``<eos>`` written in a document
        stays three pieces of text. Only the ``markup`` character spans (a chat
        template's own ``<start_of_turn>``...) have their control tokens parsed."""
        tokens = [self._model.token_bos()] if add_bos else []
        at = 0
        for start, end in [*markup, (len(text), len(text))]:
            tokens += self._tokens(text[at:start], special=False)
            tokens += self._tokens(text[start:end], special=True)
            at = end
        return tokens

    def _tokens(self, text: str, *, special: bool) -> list[int]:
        """llama.cpp's tokenizer, once per piece (llama-cpp-python's own wrapper runs
        it twice past 32K tokens) into a buffer of one token per byte at most."""
        tokens: list[int] = []
        for piece in _pieces(text, _PIECE_CHARS):
            # lone surrogates (from JSON "\\ud800", say) cannot be UTF-8: they become "?"
            data = piece.encode("utf-8", errors="replace")
            buf = (llama_cpp.llama_token * (len(data) + 2))()
            vocab = self._model.vocab
            n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, len(buf), False, special)
            if n < 0:  # pragma: no cover - more tokens than bytes cannot happen
                raise ModelError(f"llama.cpp could not tokenize {len(data)} bytes")
            tokens += buf[:n]
        return tokens

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (may be part of a UTF-8 character); ``special``
        renders control tokens (``<start_of_turn>``) as their text."""
        vocab = self._model.vocab
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        return buf.raw[: max(n, 0)]

    def word_edges(self, token: int) -> tuple[bool, bool, bool]:
        """Whether the token's text starts and ends with an ASCII letter or digit (a
        token that starts so, after one that ends so, continues the same word), and
        whether it is punctuation that closes the word before it ("." of "58316.":
        one or two ASCII punctuation characters, no space)."""
        edges = self._edges.get(token)
        if edges is None:
            raw = self.piece(token)
            closes = 0 < len(raw) <= 2 and all(c in _PUNCTUATION for c in raw)
            edges = (bool(raw[:1].isalnum()), bool(raw[-1:].isalnum()), closes)
            self._edges[token] = edges
        return edges

    def detokenize(self, tokens: list[int]) -> str:
        return self._model.detokenize(tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._model.vocab, token))

    @functools.cached_property
    def eog_ids(self) -> tuple[int, ...]:
        """Every end-of-generation token (Gemma 3: 3 of 262,144; 0.15 s once)."""
        vocab = self._model.vocab
        return tuple(i for i in range(self.info.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i))

    @property
    def add_bos(self) -> bool:
        return bool(self._model.add_bos_token())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._model.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
