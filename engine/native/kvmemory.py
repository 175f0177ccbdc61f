"""How many bytes of KV cache llama.cpp allocates, for kvtrim and for the baselines.

Sliding-window models (Gemma 2/3, Cohere 2, gpt-oss, ...) have two caches in
llama.cpp (``llama_kv_cache_iswa``): the global layers hold ``n_ctx`` cells, the
sliding-window layers only ``pad(min(n_ctx, n_swa + n_ubatch))`` cells, unless
``swa_full`` gives them ``n_ctx`` too (llama-cpp-python's default). Three figures:

- *held*: the cache a kvtrim session allocated (its ``n_ctx`` and SWA cells);
- *llama.cpp default*: what llama.cpp's default context (``swa_full`` off,
  ``n_ubatch`` 512, same KV types) allocates for the same tokens;
- *full*: a cell for every token in every layer (``swa_full`` on).

Units: cells are KV slots (one per token per layer group), sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from . import _ggml

CACHE_PAD = 256  # llama.cpp allocates both caches in multiples of 256 cells
LLAMA_UBATCH = 512  # llama.cpp's default n_ubatch
KV_TYPES: dict[str, int] = {"f16": 1, "q8_0": 8, "q4_0": 2}  # name -> ggml type id
"""KV cache types kvtrim offers (``--kv-type``)."""
SWA_CACHES = ("window", "full")
"""``window``: sliding-window layers keep window + batch cells (llama.cpp's default);
``full``: every layer keeps a cell for every held token (``swa_full``)."""


def pad(cells: int) -> int:
    """``cells`` rounded up to llama.cpp's cache granularity (at least one block)."""
    return max(CACHE_PAD, -(-cells // CACHE_PAD) * CACHE_PAD)


def swa_cells(n_ctx: int, n_swa: int, n_ubatch: int, n_seqs: int = 1) -> int:
    """Cells of llama.cpp's sliding-window cache (``llama_kv_cache_iswa``): one window
    per sequence in one shared pool (``kv_unified``) plus a micro-batch."""
    return pad(min(n_ctx, n_swa * n_seqs + n_ubatch))


@dataclass(frozen=True)
class KVLayout:
    """Bytes per cell of a model's two layer groups, for one pair of KV types."""

    global_cell_bytes: int  # all global (full-attention) layers together
    swa_cell_bytes: int  # all sliding-window layers together (0: none)
    n_swa: int  # the window in tokens (0: no sliding-window layers)

    @property
    def cell_bytes(self) -> int:
        """One cell over every layer."""
        return self.global_cell_bytes + self.swa_cell_bytes

    def allocated(self, n_ctx: int, n_swa_cells: int) -> int:
        """Bytes of a cache of ``n_ctx`` global cells and ``n_swa_cells`` SWA cells."""
        return n_ctx * self.global_cell_bytes + n_swa_cells * self.swa_cell_bytes

    def llama_default(self, n_tokens: int) -> int:
        """What llama.cpp's default context sized for ``n_tokens`` allocates."""
        if n_tokens <= 0:
            return 0
        n_ctx = pad(n_tokens)
        n_swa_cells = swa_cells(n_ctx, self.n_swa, LLAMA_UBATCH) if self.swa_cell_bytes else 0
        return self.allocated(n_ctx, n_swa_cells)

    def full(self, n_tokens: int) -> int:
        """A cell for every token in every layer."""
        return n_tokens * self.cell_bytes


def layout(
    n_layer: int,
    n_swa_layers: int,
    n_swa: int,
    k_elements: int,
    v_elements: int,
    type_k: int = KV_TYPES["f16"],
    type_v: int = KV_TYPES["f16"],
) -> KVLayout:
    """The layout of a model with ``n_swa_layers`` of ``n_layer`` layers windowed;
    ``k_elements``/``v_elements`` are K/V values per layer per cell."""
    per_layer = _ggml.row_bytes(type_k, k_elements) + _ggml.row_bytes(type_v, v_elements)
    n_swa_layers = n_swa_layers if n_swa > 0 else 0
    return KVLayout(
        global_cell_bytes=(n_layer - n_swa_layers) * per_layer,
        swa_cell_bytes=n_swa_layers * per_layer,
        n_swa=n_swa if n_swa_layers else 0,
    )


def type_name(ggml_type: int) -> str:
    return next(name for name, t in KV_TYPES.items() if t == ggml_type)


@dataclass(frozen=True)
class CacheSettings:
    """How a llama.cpp context holds KV, decided in one place for a lone session and
    for a pool alike (``decide``). ``flash_attn`` None: llama.cpp chooses."""

    flash_attn: bool | None
    type_k: int
    type_v: int
    swa_full: bool
    capture: bool  # attention is read (the eval callback)

    @classmethod
    def decide(
        cls,
        *,
        reads_attention: bool,
        kv_type: str = "f16",
        flash_attn: str = "auto",
        swa_cache: str = "window",
        window_layers_unknown: bool = False,
        who: str = "this policy",
    ) -> CacheSettings:
        """Flash attention is llama.cpp's choice unless told: attention is read with it
        on or off (native/capture.py), except over a quantized K, whose probabilities
        are read with it off. A quantized V needs flash attention, so without it only
        K is quantized; a model with a sliding window but no known window layers keeps
        every layer whole (``swa_full``)."""
        if kv_type not in KV_TYPES:
            raise ConfigError(f"kv_type must be one of {', '.join(KV_TYPES)}")
        if swa_cache not in SWA_CACHES:
            raise ConfigError(f"swa_cache must be one of {', '.join(SWA_CACHES)}")
        quantized_k_read = reads_attention and kv_type != "f16"
        flash = False if quantized_k_read else None
        if flash_attn != "auto":
            if quantized_k_read and flash_attn == "on":
                raise ConfigError(
                    f"{who} reads attention, which over a {kv_type} K cache needs flash "
                    "attention off"
                )
            flash = flash_attn == "on"
        type_k = type_v = KV_TYPES[kv_type]
        if kv_type != "f16":
            if flash is None:
                flash = True  # a quantized V cache needs flash attention
            if not flash:
                type_v = KV_TYPES["f16"]  # without flash attention only K is quantized
        swa_full = swa_cache == "full" or window_layers_unknown
        return cls(flash, type_k, type_v, swa_full, reads_attention)

    def flash_alone(self) -> bool | None:
        """Flash attention for a context of one session's own. Reading attention with
        it ``auto``, off: the prefill chunks on a CPU decoded slower with it on and
        attention read from the fused node (README demo 19.9 s against 17.2 s, 2 cores;
        streaming, reading nothing, 4% slower). A pool keeps llama.cpp's choice (on):
        its one-token steps of many sequences served 17% more requests/s with it."""
        return False if self.capture and self.flash_attn is None else self.flash_attn

    def tiles_queries(self, on_gpu: bool) -> bool:
        """Whether llama.cpp computes a many-row ubatch's attention in tiles of query
        rows x cells (ggml-cpu's tiled flash attention: on the CPU, flash attention
        not off, K and V in f16), where a tile computes every cell tile that any of
        its rows sees (pool/plan.py ``decodes``)."""
        f16 = KV_TYPES["f16"]
        return not on_gpu and self.flash_attn is not False and self.type_k == self.type_v == f16

    def describe(self) -> str:
        """``K q8_0, V f16, flash attention off, sliding-window layers windowed``."""
        flash = {None: "auto", True: "on", False: "off"}[self.flash_attn]
        swa = "whole" if self.swa_full else "windowed"
        return (
            f"K {type_name(self.type_k)}, V {type_name(self.type_v)}, flash attention "
            f"{flash}, sliding-window layers {swa}"
        )

    def refusal(self, wanted: CacheSettings) -> str | None:
        """Why a context held this way cannot run a session that ``wanted`` its own
        settings (None: it can). Flash attention ``auto`` accepts either; a context
        that reads attention also runs sessions that do not."""
        flash_ok = wanted.flash_attn is None or wanted.flash_attn == self.flash_attn
        same = (wanted.type_k, wanted.type_v, wanted.swa_full) == (
            self.type_k,
            self.type_v,
            self.swa_full,
        )
        if same and flash_ok and (self.capture or not wanted.capture):
            return None
        need = wanted.describe() + (" with attention read" if wanted.capture else "")
        return f"it needs {need}; the pool holds {self.describe()}"
