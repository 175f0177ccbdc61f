"""The memory monitor degrades cleanly without an NVIDIA GPU, and reads one with NVML."""

from __future__ import annotations

import sys
import types

from engine.monitor import MemoryMonitor


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


def test_driver_failure_degrades(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(fail=True))
    sample = MemoryMonitor().sample()
    assert sample.gpus == () and "Driver Not Loaded" in sample.gpu_note


def test_engine_never_imports_qt():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "engine"
    for path in root.rglob("*.py"):
        text = path.read_text()
        assert "PySide6" not in text and "PyQt" not in text, path


def test_gpu_layers_without_gpu_support_run_on_the_cpu_with_a_note():
    from engine import Engine, Session

    with Engine(n_gpu_layers=99) as eng:
        if eng.model.gpu_offload:  # pragma: no cover - a CUDA build on a GPU machine
            assert eng.model.device_note is None
            return
        assert "runs on the CPU" in eng.model.device_note
        with eng.session("snapkv", 128) as s:
            result = Session.collect(s.ask("Clara sold the lamp. " * 30, "Who?", max_tokens=4))
        assert result.stats.generated_tokens > 0
