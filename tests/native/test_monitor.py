"""The memory monitor degrades cleanly without an NVIDIA GPU, and reads one with NVML."""

from __future__ import annotations

import sys
import types

import pytest

from engine.native.monitor import MemoryMonitor


def test_no_gpu_is_reported_not_raised():
    mon = MemoryMonitor()
    sample = mon.sample()
    assert sample.rss_bytes > 10 * 1024 * 1024
    if not mon.has_gpu:  # this machine and CI: no NVIDIA driver
        assert sample.gpus == ()
        assert sample.gpu_note and sample.gpu_note.startswith("no NVIDIA GPU")
    assert mon.rss_peak_bytes >= sample.rss_bytes
    mon.close()


def _fake_nvml(fail: bool) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init() -> None:
        if fail:
            raise NVMLError("Driver Not Loaded")

    nv.nvmlInit = init
    nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 4070"
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 << 30, total=12 << 30)
    return nv


def test_reads_gpu_memory_through_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail=False))
    mon = MemoryMonitor()
    sample = mon.sample()
    assert mon.has_gpu and sample.gpu_note is None
    assert sample.gpus[0].name == "NVIDIA GeForce RTX 4070"
    assert sample.gpus[0].total_bytes == 12 << 30
    assert mon.gpu_peak_bytes == 3 << 30
    mon.close()  # peaks are read after the monitor closes (bench/tasks.py, the GPU check)
    assert mon.has_gpu and mon.gpu_peak_bytes == 3 << 30


def test_this_process_gpu_memory_from_nvml_or_from_the_start(monkeypatch):
    import os

    nv = _fake_nvml(fail=False)
    used = [3 << 30]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used[0], total=12 << 30)
    listed = [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=2 << 30)]
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: listed
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    mon = MemoryMonitor()
    assert mon.sample().process_gpu_bytes == 2 << 30  # NVML lists this process
    # a container whose NVML lists host pids: the device's use since the monitor began
    listed[:] = [types.SimpleNamespace(pid=1, usedGpuMemory=None)]
    used[0] = 8 << 30
    sample = mon.sample()
    assert sample.process_gpu_bytes == 5 << 30 and sample.gpus[0].process_bytes is None
    assert mon.process_gpu_peak_bytes == 5 << 30 and mon.gpu_peak_bytes == 8 << 30
    assert sample.t >= 0


def test_recorder_keeps_every_sample_and_the_peaks(monkeypatch):
    import time

    from engine.native.monitor import MemoryRecorder

    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail=False))
    with MemoryRecorder(interval_s=0.01) as rec:
        time.sleep(0.1)
    assert len(rec.samples) >= 3
    times = [s.t for s in rec.samples]
    assert times == sorted(times)
    assert rec.monitor.gpu_peak_bytes == 3 << 30 and rec.monitor.rss_peak_bytes > 0


def test_driver_failure_degrades(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail=True))
    sample = MemoryMonitor().sample()
    assert sample.gpus == () and "Driver Not Loaded" in sample.gpu_note


def test_engine_never_imports_qt():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "engine"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "PySide6" not in text and "PyQt" not in text, path


@pytest.mark.slow
def test_gpu_layers_without_gpu_support_run_on_the_cpu_with_a_note():
    from engine import Engine, Session

    with Engine(n_gpu_layers=99) as eng:
        if eng.model.gpu_offload:  # pragma: no cover - a CUDA build on a GPU machine
            assert eng.model.device_note is None
            return
        assert "runs on the CPU" in eng.model.device_note
        assert eng.notes == (eng.model.device_note,)
        with eng.session("snapkv", 128) as s:
            result = Session.collect(s.ask("Clara sold the lamp. " * 30, "Who?", max_tokens=4))
        assert result.stats.generated_tokens > 0


def test_the_app_graph_plots_what_the_gpu_check_measures(qtbot):
    """The app's memory graph shows the sample's own process figure, the one the
    GPU check (scripts/gpu/check.sh) records with the same monitor."""
    import math

    from app.graphs import MemoryGraphs
    from engine.native.monitor import GpuMemory, MemorySample

    graphs = MemoryGraphs()
    qtbot.addWidget(graphs)
    gpu = GpuMemory(0, "NVIDIA GeForce RTX 4070", 9 << 30, 12 << 30, 6 << 30)
    graphs.add_memory(MemorySample(1 << 30, (gpu,), None, 6 << 30, 1.0))
    text = graphs.memory_label.text()
    assert "9,216 of 12,288 MB used" in text and "kvtrim 6,144 MB" in text
    _, ys = graphs.mem_process.getData()
    assert list(ys) == [6144.0]
    graphs.add_memory(MemorySample(1 << 30, (), "no NVIDIA GPU (test)"))
    assert "No NVIDIA GPU" in graphs.memory_label.text()
    assert math.isnan(graphs.memory[-1][3])


def test_gpu_backends_from_llama_cpp_system_info():
    from engine.native.cpu import gpu_backends

    cuda = "CUDA : ARCHS = 900 | NO_VMM = 1 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX2 = 1 | "
    assert gpu_backends(cuda) == ["CUDA"]
    assert gpu_backends("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | OPENMP = 1 | REPACK = 1 |") == []


def test_a_gpu_build_without_a_gpu_says_so(monkeypatch):
    """The CUDA build made by scripts/gpu/build_wheel.sh, loaded here (no driver),
    runs on the CPU; the note names the build and the missing GPU, not a CPU build."""
    from engine.native import model as model_module

    monkeypatch.setattr(model_module, "system_info", lambda: "CUDA : ARCHS = 900 | CPU : AVX2 = 1")
    m = object.__new__(model_module.Model)
    m.n_gpu_layers, m.gpu_offload = 99, False
    assert "this CUDA build of llama.cpp found no usable GPU" in m.device_note
