"""Process and GPU memory: RSS through psutil, GPU memory through NVML.

NVML (nvidia-ml-py, imported as ``pynvml``) is optional at run time: without an
NVIDIA driver or GPU the monitor reports "no NVIDIA GPU" and the reason.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import ModuleType

import psutil


@dataclass(frozen=True)
class GpuMemory:
    """One device: memory used and total (units: bytes)."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class MemorySample:
    """Process RSS (bytes) and each GPU's memory, or why there is none."""

    rss_bytes: int
    gpus: tuple[GpuMemory, ...] = ()
    gpu_note: str | None = None


@dataclass
class MemoryMonitor:
    """Samples memory; tracks the peak RSS and peak GPU use since creation."""

    rss_peak_bytes: int = 0
    gpu_peak_bytes: int = 0
    gpu_note: str | None = None
    _nvml: ModuleType | None = field(default=None, repr=False)
    _process: psutil.Process = field(default_factory=psutil.Process, repr=False)

    def __post_init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                raise RuntimeError("no devices")
            self._nvml = pynvml
        except Exception as exc:  # no driver, no GPU, no library: all the same to users
            self._nvml = None
            self.gpu_note = f"no NVIDIA GPU ({type(exc).__name__}: {exc})".rstrip()

    @property
    def has_gpu(self) -> bool:
        return self._nvml is not None

    def _gpus(self) -> tuple[GpuMemory, ...]:
        nv = self._nvml
        if nv is None:
            return ()
        out = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                name = nv.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                out.append(GpuMemory(i, name, int(mem.used), int(mem.total)))
        except Exception as exc:
            self.gpu_note = f"NVML failed: {exc}"
            return ()
        return tuple(out)

    def sample(self) -> MemorySample:
        rss = int(self._process.memory_info().rss)
        gpus = self._gpus()
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.gpu_peak_bytes = max(self.gpu_peak_bytes, sum(g.used_bytes for g in gpus))
        return MemorySample(rss, gpus, None if gpus else self.gpu_note)

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None
