"""Live memory graphs (pyqtgraph) on one time axis: seconds since the app started.

The KV plot draws the cache the session holds against two baselines for the same
tokens: what llama.cpp's own default context would allocate (sliding-window
layers at window + batch cells; the comparison the label states first) and a
cache with a cell per token in every layer (llama-cpp-python's ``swa_full``).
Below it: tokens in cache against tokens seen, and GPU memory (NVML) or, without
an NVIDIA GPU, the process's RAM. Each plot's title and legend sit in a line
above it, off the data, and the three show the same span of time: from the shown
chat's first sample (or the app's start) to now."""

from __future__ import annotations

import html
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine.native.monitor import MemorySample
from engine.stats import KVStats

_MB = 2**20
HISTORY = 3000  # samples per curve: 25 minutes at 2 Hz
MIN_SPAN_S = 10.0  # the time axis shows at least this many seconds
TIME_LABEL = "s since kvtrim started"
SOLID, DASH, DOT = Qt.PenStyle.SolidLine, Qt.PenStyle.DashLine, Qt.PenStyle.DotLine
_GLYPHS = {SOLID: "━━━", DASH: "━&nbsp;━", DOT: "┅┅┅"}  # HTML, unbreakable
# (name in the legend, colour, width, style) of each curve
KV_CURVES = (
    ("held", "#2a9d8f", 2.0, SOLID),
    ("llama.cpp default", "#e76f51", 2.0, DASH),
    ("swa_full (every layer)", "#f4a261", 1.5, DOT),
)
TOKEN_CURVES = (("in cache", "#2a9d8f", 2.0, SOLID), ("seen", "#e9c46a", 2.0, SOLID))
MEMORY_CURVES = (
    ("used", "#8ab4f8", 2.0, SOLID),
    ("total", "#9aa0a6", 1.0, DOT),  # a GPU's; not listed without one
    ("kvtrim", "#c58af9", 2.0, SOLID),  # this process on the GPU: weights, KV, buffers
)

Curve = tuple[str, str, float, Qt.PenStyle]


def legend_html(title: str, curves: Sequence[Curve]) -> str:
    """A plot's title and a sample of each curve's line with its name."""
    items = "&nbsp;&nbsp; ".join(
        f'<span style="color:{colour}">{_GLYPHS[style]}</span>&nbsp;{_unbroken(name)}'
        for name, colour, _, style in curves
    )
    return f"<b>{html.escape(title)}</b>&nbsp;&nbsp;&nbsp; {items}"


def _unbroken(text: str) -> str:
    """A legend entry wraps as a whole, never inside its name."""
    return html.escape(text).replace(" ", "&nbsp;")


class MemoryGraphs(QWidget):
    """Three small plots; ``add`` takes engine stats, ``add_memory`` monitor samples."""

    def __init__(
        self, parent: QWidget | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(parent)
        self._clock = clock
        self._t0 = clock()  # the time axis: seconds since then, for every plot
        # (s, held MB, llama.cpp default MB, swa_full MB, cells used, tokens seen)
        self.samples: deque[tuple[float, float, float, float, int, int]] = deque(maxlen=HISTORY)
        self.memory: deque[tuple[float, float, float, float]] = deque(maxlen=HISTORY)
        self.last: KVStats | None = None
        self.saving = QLabel("No document read yet.")
        self.saving.setWordWrap(True)
        self.memory_label = QLabel()
        self.memory_label.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.kv_plot, self.kv_legend = self._plot(layout, "KV cache (MB)", KV_CURVES)
        layout.addWidget(self.saving)
        self.tok_plot, self.tok_legend = self._plot(layout, "tokens", TOKEN_CURVES)
        self.mem_plot, self.mem_legend = self._plot(layout, "memory (MB)", MEMORY_CURVES[:1])
        layout.addWidget(self.memory_label)
        self.kv_held, self.kv_default, self.kv_full = (
            self._curve(self.kv_plot, c) for c in KV_CURVES
        )
        self.tok_cache, self.tok_seen = (self._curve(self.tok_plot, c) for c in TOKEN_CURVES)
        self.mem_used, self.mem_total, self.mem_process = (
            self._curve(self.mem_plot, c) for c in MEMORY_CURVES
        )
        for plot in (self.tok_plot, self.mem_plot):
            plot.setXLink(self.kv_plot)  # one time axis
        self.mem_plot.setLabel("bottom", TIME_LABEL)  # under the last plot, for all three

    @staticmethod
    def _plot(
        layout: QVBoxLayout, title: str, curves: Sequence[Curve]
    ) -> tuple[pg.PlotWidget, QLabel]:
        legend = QLabel(legend_html(title, curves))
        legend.setWordWrap(True)
        plot = pg.PlotWidget()
        plot.setMinimumHeight(110)
        plot.showGrid(x=False, y=True, alpha=0.3)
        plot.setMouseEnabled(x=False, y=True)
        plot.enableAutoRange(axis=pg.ViewBox.XAxis, enable=False)
        plot.getViewBox().setAutoVisible(y=True)  # y fits the samples in the time shown
        layout.addWidget(legend)
        layout.addWidget(plot, 1)
        return plot, legend

    @staticmethod
    def _curve(plot: pg.PlotWidget, curve: Curve) -> pg.PlotDataItem:
        _, colour, width, style = curve
        return plot.plot(pen=pg.mkPen(colour, width=width, style=style))

    def set_dark(self, dark: bool) -> None:
        """Backgrounds and axes for a dark or a light theme (legends follow the palette)."""
        fg = "#d0d0d0" if dark else "#404040"
        bg = "#16181b" if dark else "#ffffff"
        for plot in (self.kv_plot, self.tok_plot, self.mem_plot):
            plot.setBackground(bg)
            item = plot.getPlotItem()
            for axis in ("left", "bottom"):
                item.getAxis(axis).setPen(fg)
                item.getAxis(axis).setTextPen(fg)

    def now(self) -> float:
        """Seconds since the app started: the x of every sample."""
        return self._clock() - self._t0

    def start(self) -> None:
        """A new job: its first sample comes from the engine, not the last job's, and
        the curves break here (no line is drawn across two requests)."""
        self.last = None
        if self.samples and not math.isnan(self.samples[-1][1]):
            self.samples.append((self.now(), *[math.nan] * 5))

    def clear(self) -> None:
        """Another chat is shown: the KV and token graphs start empty."""
        self.samples.clear()
        self.last = None
        for curve in (self.kv_held, self.kv_default, self.kv_full, self.tok_cache, self.tok_seen):
            curve.setData([], [])
        self.saving.setText("No document read yet.")
        self._follow_time()

    def add(self, stats: KVStats) -> None:
        """One KV sample now (an engine event, or the last one again on a timer tick)."""
        self.last = stats
        held, default = stats.kv_bytes / _MB, stats.kv_bytes_llama_default / _MB
        full = stats.kv_bytes_full / _MB
        self.samples.append((self.now(), held, default, full, stats.cells_used, stats.tokens_seen))
        xs = [s[0] for s in self.samples]
        curves = (self.kv_held, self.kv_default, self.kv_full, self.tok_cache, self.tok_seen)
        for i, curve in enumerate(curves, start=1):
            curve.setData(xs, [s[i] for s in self.samples], connect="finite")
        self.saving.setText(saving_text(stats))
        self._follow_time()

    def add_memory(self, sample: MemorySample) -> None:
        """GPU memory when NVML sees a GPU, else the process's RAM."""
        mine = float("nan")
        if sample.gpus:
            gpu = sample.gpus[0]
            used, total = gpu.used_bytes / _MB, gpu.total_bytes / _MB
            title = f"GPU memory (MB): {gpu.name}"
            text = f"{gpu.name}: {used:,.0f} of {total:,.0f} MB used"
            if sample.process_gpu_bytes is not None:
                mine = sample.process_gpu_bytes / _MB
                text += f", kvtrim {mine:,.0f} MB (model, KV cache, buffers)"
            text += f" · process RAM {sample.rss_bytes / _MB:,.0f} MB"
        else:
            used, total = sample.rss_bytes / _MB, float("nan")
            title = "process RAM (MB): no NVIDIA GPU"
            text = f"No NVIDIA GPU: showing process RAM, {used:,.0f} MB"
        self.mem_legend.setText(
            legend_html(title, MEMORY_CURVES if sample.gpus else MEMORY_CURVES[:1])
        )
        self.memory.append((self.now(), used, total, mine))
        xs = [m[0] for m in self.memory]
        self.mem_used.setData(xs, [m[1] for m in self.memory])
        if sample.gpus:
            self.mem_total.setData(xs, [m[2] for m in self.memory])
            self.mem_process.setData(xs, [m[3] for m in self.memory], connect="finite")
        else:
            self.mem_total.setData([], [])
            self.mem_process.setData([], [])
        self.memory_label.setText(text)
        self._follow_time()

    def span(self) -> tuple[float, float]:
        """The time the plots show: from the chat's first KV sample (or the app's
        start) to now, at least ``MIN_SPAN_S`` long."""
        end = self.now()
        start = self.samples[0][0] if self.samples else 0.0
        return max(0.0, min(start, end - MIN_SPAN_S)), max(end, MIN_SPAN_S)

    def _follow_time(self) -> None:
        self.kv_plot.setXRange(*self.span(), padding=0.01)


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
