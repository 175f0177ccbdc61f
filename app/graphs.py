"""Live memory graphs (pyqtgraph): KV cache held against what a full cache would
need for the same tokens, and tokens in cache against tokens seen."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from engine.stats import KVStats

_MB = 2**20


class MemoryGraphs(QWidget):
    """Two small plots that grow by one sample per ``add(stats)``."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.samples: list[tuple[float, float, float, int, int]] = []
        self.kv_plot = pg.PlotWidget(title="KV cache (MB)")
        self.kv_plot.addLegend(offset=(5, 5))
        self.kv_held = self.kv_plot.plot(name="held", pen=pg.mkPen("#2a9d8f", width=2))
        self.kv_full = self.kv_plot.plot(
            name="full cache would need",
            pen=pg.mkPen("#e76f51", width=2, style=Qt.PenStyle.DashLine),
        )
        self.tok_plot = pg.PlotWidget(title="tokens")
        self.tok_plot.addLegend(offset=(5, 5))
        self.tok_cache = self.tok_plot.plot(name="in cache", pen=pg.mkPen("#2a9d8f", width=2))
        self.tok_seen = self.tok_plot.plot(name="seen", pen=pg.mkPen("#e9c46a", width=2))
        for plot in (self.kv_plot, self.tok_plot):
            plot.setMinimumHeight(140)
            plot.showGrid(x=False, y=True, alpha=0.3)
            plot.getPlotItem().hideAxis("bottom")
        self.saving = QLabel("No document read yet.")
        self.saving.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.kv_plot)
        layout.addWidget(self.tok_plot)
        layout.addWidget(self.saving)

    def add(self, stats: KVStats) -> None:
        held = stats.kv_bytes / _MB
        full = stats.kv_bytes_full / _MB
        self.samples.append(
            (float(len(self.samples)), held, full, stats.cells_used, stats.tokens_seen)
        )
        xs = [s[0] for s in self.samples]
        self.kv_held.setData(xs, [s[1] for s in self.samples])
        self.kv_full.setData(xs, [s[2] for s in self.samples])
        self.tok_cache.setData(xs, [s[3] for s in self.samples])
        self.tok_seen.setData(xs, [s[4] for s in self.samples])
        if full > held > 0:
            self.saving.setText(
                f"Saving {full - held:.1f} MB: the cache holds {held:.1f} MB where a full "
                f"cache would need {full:.1f} MB ({full / held:.1f}x)."
            )
        else:
            self.saving.setText(f"Cache {held:.1f} MB; nothing evicted yet.")

    def clear(self) -> None:
        self.samples.clear()
        for curve in (self.kv_held, self.kv_full, self.tok_cache, self.tok_seen):
            curve.setData([], [])
