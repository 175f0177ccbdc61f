"""Process and GPU memory: RSS through psutil, GPU memory through NVML.

NVML (nvidia-ml-py, imported as ``pynvml``) is optional at run time: without an
NVIDIA driver or GPU the monitor reports "no NVIDIA GPU" and the reason.

One sampler for everything that reports memory: the app's graph (a sample every
half second), the command line's peaks and the GPU check (scripts/gpu/check.sh,
a ``MemoryRecorder`` thread), so the app shows what the check measured. The GPU
figure is this process's own memory on the device (weights, KV cache and compute
buffers) where NVML lists it, else the device's use minus what it used when the
monitor started.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
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
    process_bytes: int | None = None  # this process's, when NVML lists it (not on every host)


@dataclass(frozen=True)
class MemorySample:
    """Process RSS (bytes) and each GPU's memory, or why there is none."""

    rss_bytes: int
    gpus: tuple[GpuMemory, ...] = ()
    gpu_note: str | None = None
    process_gpu_bytes: int | None = None  # this process on every GPU (see the module doc)
    t: float = 0.0  # seconds since the monitor started


@dataclass
class MemoryMonitor:
    """Samples memory; tracks the peak RSS and peak GPU use since creation."""

    rss_peak_bytes: int = 0
    gpu_peak_bytes: int = 0  # the devices' use, every process's
    process_gpu_peak_bytes: int = 0  # this process's (see the module doc)
    gpu_note: str | None = None
    _nvml: ModuleType | None = field(default=None, repr=False)
    _process: psutil.Process = field(default_factory=psutil.Process, repr=False)
    _start: float = field(default_factory=time.monotonic, repr=False)
    _baseline: int | None = field(default=None, repr=False)  # devices' use at start
    _gpu_seen: bool = field(default=False, repr=False)

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
            return
        self._gpu_seen = True
        self._baseline = sum(g.used_bytes for g in self._gpus())

    @property
    def has_gpu(self) -> bool:
        """NVML saw a GPU when the monitor started; still true after ``close``, so
        peaks read after it are reported as GPU figures."""
        return self._gpu_seen

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
                mine = self._process_bytes(h)
                out.append(GpuMemory(i, name, int(mem.used), int(mem.total), mine))
        except Exception as exc:
            self.gpu_note = f"NVML failed: {exc}"
            return ()
        return tuple(out)

    def _process_bytes(self, handle: object) -> int | None:
        """This process's memory on one device, from NVML's list of compute
        processes; None where the list lacks it (some containers see other pids)."""
        nv = self._nvml
        assert nv is not None
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return None
        pid = os.getpid()
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            if getattr(proc, "pid", None) == pid and isinstance(used, int):
                return used
        return None  # not listed: nothing held there, or (in a container) another pid

    def sample(self) -> MemorySample:
        rss = int(self._process.memory_info().rss)
        gpus = self._gpus()
        used = sum(g.used_bytes for g in gpus)
        mine: int | None = None
        if gpus:
            listed = [g.process_bytes for g in gpus if g.process_bytes is not None]
            # this process, on the devices that list it; else their use since the start
            mine = sum(listed) if listed else max(0, used - (self._baseline or 0))
            self.process_gpu_peak_bytes = max(self.process_gpu_peak_bytes, mine)
        self.rss_peak_bytes = max(self.rss_peak_bytes, rss)
        self.gpu_peak_bytes = max(self.gpu_peak_bytes, used)
        t = time.monotonic() - self._start
        return MemorySample(rss, gpus, None if gpus else self.gpu_note, mine, t)

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()
            self._nvml = None


class MemoryRecorder:
    """Samples a ``MemoryMonitor`` every ``interval_s`` on a thread, keeping every
    sample (for a plot) and the peaks (for a table): the GPU check's recorder."""

    def __init__(self, interval_s: float = 0.05, monitor: MemoryMonitor | None = None) -> None:
        self.monitor = monitor or MemoryMonitor()
        self.samples: list[MemorySample] = []
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-recorder", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(self.monitor.sample())
            if self._stop.wait(self._interval):
                return

    def __enter__(self) -> MemoryRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.monitor.sample())
        self.monitor.close()
