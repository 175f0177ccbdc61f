"""Live memory graphs (pyqtgraph), x in seconds.

The KV plot draws the cache the session holds against two baselines for the same
tokens: what llama.cpp's own default context would allocate (sliding-window
layers at window + batch cells; the comparison the label states first) and a
cache with a cell per token in every layer (llama-cpp-python's ``swa_full``).
Below it: tokens in cache against tokens seen, and GPU memory (NVML) or, without
an NVIDIA GPU, the process's RAM."""

from __future__ import annotations

import time
from collections import deque

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine.native.monitor import MemorySample
from engine.stats import KVStats

_MB = 2**20
HISTORY = 3000  # samples per curve: 25 minutes at 2 Hz


class MemoryGraphs(QWidget):
    """Three small plots; ``add`` takes engine stats, ``add_memory`` monitor samples."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        # (s, held MB, llama.cpp default MB, swa_full MB, cells used, tokens seen)
        self.samples: deque[tuple[float, float, float, float, int, int]] = deque(maxlen=HISTORY)
        self.memory: deque[tuple[float, float, float, float]] = deque(maxlen=HISTORY)
        self._t0 = time.monotonic()
        self._job_t0 = self._t0
        self.last: KVStats | None = None
        self.kv_plot = pg.PlotWidget(title="KV cache (MB)")
        self.kv_plot.addLegend(offset=(5, 5))
        self.kv_held = self.kv_plot.plot(name="held", pen=pg.mkPen("#2a9d8f", width=2))
        self.kv_default = self.kv_plot.plot(
            name="llama.cpp default",
            pen=pg.mkPen("#e76f51", width=2, style=Qt.PenStyle.DashLine),
        )
        self.kv_full = self.kv_plot.plot(
            name="swa_full (every layer)",
            pen=pg.mkPen("#f4a261", width=1.5, style=Qt.PenStyle.DotLine),
        )
        self.tok_plot = pg.PlotWidget(title="tokens")
        self.tok_plot.addLegend(offset=(5, 5))
        self.tok_cache = self.tok_plot.plot(name="in cache", pen=pg.mkPen("#2a9d8f", width=2))
        self.tok_seen = self.tok_plot.plot(name="seen", pen=pg.mkPen("#e9c46a", width=2))
        self.mem_plot = pg.PlotWidget(title="memory (MB)")
        self.mem_plot.addLegend(offset=(5, 5))
        self.mem_used = self.mem_plot.plot(name="used", pen=pg.mkPen("#8ab4f8", width=2))
        # no name: the legend lists "total" only once a GPU reports it
        self.mem_total = self.mem_plot.plot(
            pen=pg.mkPen("#9aa0a6", width=1, style=Qt.PenStyle.DotLine)
        )
        # this process on the GPU (weights, KV, compute buffers): what the GPU check measures
        self.mem_process = self.mem_plot.plot(pen=pg.mkPen("#c58af9", width=2))
        self._total_in_legend = False
        for plot in (self.kv_plot, self.tok_plot, self.mem_plot):
            plot.setMinimumHeight(120)
            plot.showGrid(x=False, y=True, alpha=0.3)
            plot.setLabel("bottom", "s")
        self.saving = QLabel("No document read yet.")
        self.saving.setWordWrap(True)
        self.memory_label = QLabel()
        self.memory_label.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.kv_plot)
        layout.addWidget(self.saving)
        layout.addWidget(self.tok_plot)
        layout.addWidget(self.mem_plot)
        layout.addWidget(self.memory_label)

    def set_dark(self, dark: bool) -> None:
        """Backgrounds, titles, axes and legends for a dark or a light theme."""
        fg = "#d0d0d0" if dark else "#404040"
        bg = "#16181b" if dark else "#ffffff"
        for plot in (self.kv_plot, self.tok_plot, self.mem_plot):
            plot.setBackground(bg)
            item = plot.getPlotItem()
            item.titleLabel.setAttr("color", fg)
            item.setTitle(item.titleLabel.text)  # redrawn in the new colour
            # a legend on a backing, so a line passing under it leaves it readable
            backing = pg.mkColor(bg)
            backing.setAlpha(220)
            item.legend.setBrush(backing)
            item.legend.setLabelTextColor(fg)
            for _, label in item.legend.items:
                label.setText(label.text)  # redrawn in the new colour
            for axis in ("left", "bottom"):
                item.getAxis(axis).setPen(fg)
                item.getAxis(axis).setTextPen(fg)

    def start(self) -> None:
        """A new job: the KV and token graphs start again at 0 s."""
        self.samples.clear()
        self.last = None
        self._job_t0 = time.monotonic()
        for curve in (self.kv_held, self.kv_default, self.kv_full, self.tok_cache, self.tok_seen):
            curve.setData([], [])

    def add(self, stats: KVStats) -> None:
        """One KV sample now (an engine event, or the last one again on a timer tick)."""
        self.last = stats
        held, default = stats.kv_bytes / _MB, stats.kv_bytes_llama_default / _MB
        full = stats.kv_bytes_full / _MB
        t = time.monotonic() - self._job_t0
        self.samples.append((t, held, default, full, stats.cells_used, stats.tokens_seen))
        xs = [s[0] for s in self.samples]
        self.kv_held.setData(xs, [s[1] for s in self.samples])
        self.kv_default.setData(xs, [s[2] for s in self.samples])
        self.kv_full.setData(xs, [s[3] for s in self.samples])
        self.tok_cache.setData(xs, [s[4] for s in self.samples])
        self.tok_seen.setData(xs, [s[5] for s in self.samples])
        self.saving.setText(saving_text(stats))

    def add_memory(self, sample: MemorySample) -> None:
        """GPU memory when NVML sees a GPU, else the process's RAM."""
        t = time.monotonic() - self._t0
        mine = float("nan")
        if sample.gpus:
            gpu = sample.gpus[0]
            used, total = gpu.used_bytes / _MB, gpu.total_bytes / _MB
            self.mem_plot.setTitle(f"GPU memory (MB): {gpu.name}")
            text = f"{gpu.name}: {used:,.0f} of {total:,.0f} MB used"
            if sample.process_gpu_bytes is not None:
                mine = sample.process_gpu_bytes / _MB
                text += f", kvtrim {mine:,.0f} MB (model, KV cache, buffers)"
            text += f" · process RAM {sample.rss_bytes / _MB:,.0f} MB"
        else:
            used, total = sample.rss_bytes / _MB, float("nan")
            self.mem_plot.setTitle("process RAM (MB): no NVIDIA GPU")
            text = f"No NVIDIA GPU: showing process RAM, {used:,.0f} MB"
        self.memory.append((t, used, total, mine))
        xs = [m[0] for m in self.memory]
        self.mem_used.setData(xs, [m[1] for m in self.memory])
        if sample.gpus:
            self.mem_total.setData(xs, [m[2] for m in self.memory])
            self.mem_process.setData(xs, [m[3] for m in self.memory], connect="finite")
            if not self._total_in_legend:
                legend = self.mem_plot.getPlotItem().legend
                legend.addItem(self.mem_total, "total")
                legend.addItem(self.mem_process, "kvtrim")
                self._total_in_legend = True
        else:
            self.mem_total.setData([], [])
            self.mem_process.setData([], [])
        self.memory_label.setText(text)


def saving_text(stats: KVStats) -> str:
    """The KV label: the saving against llama.cpp's default cache first, then the
    cache with every layer at full length; "no saving yet" when there is none."""
    held, default = stats.kv_bytes / _MB, stats.kv_bytes_llama_default / _MB
    full = stats.kv_bytes_full / _MB
    kv_type = _kv_type_note(stats.kv_type)
    if stats.tokens_seen <= 0:
        return f"Cache {held:.1f} MB, no tokens read yet.{kv_type}"
    kept = f"{stats.cells_used:,} of {stats.tokens_seen:,} tokens kept."
    if default > held > 0:
        return (
            f"<b>Saving {default - held:.1f} MB</b>: the cache holds {held:.1f} MB where "
            f"llama.cpp's default cache would hold {default:.1f} MB ({default / held:.1f}x); "
            f"a cache with every layer at full length: {full:.1f} MB. {kept}{kv_type}"
        )
    return (
        f"<b>No saving yet</b>: the cache holds {held:.1f} MB for {stats.tokens_seen:,} "
        f"tokens, and llama.cpp's default would hold {default:.1f} MB (every layer at full "
        f"length: {full:.1f} MB). A text that fits the budget is held whole, as llama.cpp "
        f"would; eviction saves once the text outgrows budget + chunk. {kept}{kv_type}"
    )


def _kv_type_note(kv_type: str) -> str:
    """A sentence naming a quantized cache type ("q8_0/f16" is K q8_0, V f16); "" for f16."""
    if kv_type == "f16":
        return ""
    k, _, v = kv_type.partition("/")
    types = f"K {k}, V {v}" if v else f"K and V {k}"
    return f" Cache type: {types}; the baselines use the same types."
