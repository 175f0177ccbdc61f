"""Which CPU path llama.cpp takes, and whether its weight repacking is safe here.

llama.cpp repacks quantized weights into CPU-specific layouts ("extra buffer
types": AMX tiles on recent Xeons, interleaved blocks for AVX2/AVX-512/NEON).
On CPUs with AMX the first decode of a Q4_K model crashes inside
``ggml_backend_amx_mul_mat`` (upstream llama.cpp issue 20824, closed without a
fix). ``auto`` therefore turns repacking off where AMX is present, either in
llama.cpp's build (``AMX_INT8 = 1`` in its system info) or in the CPU's flags.

>>> resolve_repack("auto").describe()  # doctest: +SKIP
'repacking on (AVX2 CPU path, no AMX)'
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import threadpoolctl
from llama_cpp import Llama

from ..errors import ConfigError

REPACK_MODES = ("auto", "on", "off")
REPACK_ENV = "KVTRIM_REPACK"
_CPUINFO = Path("/proc/cpuinfo")
_SHOWN = ("AMX_INT8", "AVX512_BF16", "AVX512", "AVX2", "AVX", "NEON", "SVE")


@functools.cache
def system_info() -> str:
    """llama.cpp's one-line build and CPU report (``llama_print_system_info``)."""
    raw = llama_cpp.llama_print_system_info()
    return raw.decode("utf-8", "replace").strip() if raw else ""


def build_features(info: str) -> dict[str, bool]:
    """``{"AVX2": True, "AMX_INT8": False, ...}`` from llama.cpp's system info."""
    found: dict[str, bool] = {}
    for part in info.replace("|", "\n").splitlines():
        name, sep, value = part.rpartition("=")
        name = name.split(":")[-1].strip()
        if sep and name:
            found[name] = found.get(name, False) or value.strip() not in ("", "0")
    return found


_GPU_BACKENDS = ("CUDA", "ROCm", "HIP", "Vulkan", "Metal", "SYCL", "MUSA", "CANN", "OpenCL")


def gpu_backends(info: str) -> list[str]:
    """The GPU backends llama.cpp was built with, from its system info
    (``"CUDA : ARCHS = 900 | ... | CPU : ..."``): ["CUDA"], or [] for a CPU build."""
    names = {part.split(":")[0].strip() for part in info.split("|") if ":" in part}
    return [b for b in _GPU_BACKENDS if b in names]


@functools.cache
def cpu_flags(path: Path = _CPUINFO) -> frozenset[str]:
    """The kernel's CPU flags (``/proc/cpuinfo``); empty where it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


@dataclass(frozen=True)
class CpuPath:
    """The decision: ``repack`` on or off, asked for as ``mode``, and why."""

    mode: str
    repack: bool
    reason: str
    features: str

    def describe(self) -> str:
        state = "on" if self.repack else "off"
        return f"repacking {state} ({self.reason}); CPU path: {self.features or 'unknown'}"

    def short(self) -> str:
        """For a status line: ``AVX2 · repack on (auto)``."""
        best = self.features.split(" ")[0] if self.features else "CPU"
        why = "AMX" if "AMX" in self.reason and not self.repack else self.mode
        return f"{best} · repack {'on' if self.repack else 'off'} ({why})"


def requested_mode(mode: str | None = None) -> str:
    """``mode`` or, when None, ``$KVTRIM_REPACK`` or ``auto``; checked."""
    chosen = (mode if mode is not None else os.environ.get(REPACK_ENV, "auto")).strip().lower()
    if chosen not in REPACK_MODES:
        source = f"{REPACK_ENV}={chosen!r}" if mode is None else f"repack {chosen!r}"
        raise ConfigError(f"{source}: must be one of {', '.join(REPACK_MODES)}")
    return chosen


def resolve_repack(
    mode: str | None = None, info: str | None = None, flags: frozenset[str] | None = None
) -> CpuPath:
    """Decide whether llama.cpp may repack weights (``use_extra_bufts``)."""
    chosen = requested_mode(mode)
    build = build_features(system_info() if info is None else info)
    flags = cpu_flags() if flags is None else flags
    shown = " ".join(name for name in _SHOWN if build.get(name))
    if chosen != "auto":
        return CpuPath(chosen, chosen == "on", f"asked for: {chosen}", shown)
    if build.get("AMX_INT8") or "amx_int8" in flags or "amx_tile" in flags:
        where = "llama.cpp built with AMX" if build.get("AMX_INT8") else "CPU has AMX"
        reason = f"auto: {where}, whose repacked path crashes (llama.cpp issue 20824)"
        return CpuPath(chosen, False, reason, shown)
    return CpuPath(chosen, True, "auto: no AMX on this CPU", shown)


def reference_llama(model_path: str, repack: bool | None = None, **kwargs: Any) -> Llama:
    """A plain ``llama_cpp.Llama`` (the reference the benchmark and tests compare
    with) under the same repacking rule as kvtrim's own model: its constructor
    takes no such setting, so the default model parameters are patched while it
    loads (single-threaded use only)."""
    from llama_cpp import llama_cpp as raw

    allowed = resolve_repack().repack if repack is None else repack
    default = raw.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = allowed
        return p

    raw.llama_model_default_params = params
    try:
        return Llama(model_path, **kwargs)
    finally:
        raw.llama_model_default_params = default


@functools.cache
def one_blas_thread() -> None:
    """Give numpy's BLAS one thread, once per process. OpenBLAS's threads spin after
    each call, on the cores llama.cpp's threads compute on: reading attention under
    flash attention (a few small matrix products inside the eval callback) made 20
    one-token decodes take 2.88 s against 0.52 s with one BLAS thread (2 cores).
    kvtrim's own numpy work is small; llama.cpp owns the cores."""
    threadpoolctl.threadpool_limits(limits=1, user_api="blas")
