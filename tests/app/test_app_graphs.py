"""Issue 22, finding 5: the graphs' legends sit above the plots, off the data, and
the three plots share one time axis (seconds since the app started)."""

from __future__ import annotations

from helpers.fakes import fake_stats as _stats

from app.graphs import MemoryGraphs
from engine.native.monitor import MemorySample


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _ram(mb: float) -> MemorySample:
    return MemorySample(rss_bytes=int(mb * 2**20), gpus=(), process_gpu_bytes=None)


def test_legends_sit_above_the_plots_not_on_the_data(qtbot):
    g = MemoryGraphs()
    qtbot.addWidget(g)
    for plot, legend, names in (
        (g.kv_plot, g.kv_legend, ["held", "llama.cpp default", "swa_full (every layer)"]),
        (g.tok_plot, g.tok_legend, ["in cache", "seen"]),
        (g.mem_plot, g.mem_legend, ["used"]),
    ):
        assert plot.getPlotItem().legend is None  # nothing drawn over the curves
        text = legend.text().replace("&nbsp;", " ")
        assert all(name in text for name in names)
        layout = g.layout()
        assert layout.indexOf(legend) == layout.indexOf(plot) - 1  # the line above it


def test_all_graphs_share_one_time_axis(qtbot):
    clock = Clock()
    g = MemoryGraphs(clock=clock)
    qtbot.addWidget(g)
    clock.now = 130.0  # a request 30 s after the app started
    g.start()
    g.add_memory(_ram(200))
    g.add(_stats())
    assert g.memory[-1][0] == g.samples[-1][0] == 30.0  # both seconds since the start
    clock.now = 135.0
    g.add(_stats())
    g.add_memory(_ram(201))
    ranges = [p.getViewBox().viewRange()[0] for p in (g.kv_plot, g.tok_plot, g.mem_plot)]
    assert ranges[0] == ranges[1] == ranges[2]
    low, high = ranges[0]
    assert low <= 25.0 and 35.0 <= high < 36.0  # the request's samples, at least 10 s
    g.clear()  # another chat: its KV graphs start empty, the time axis goes on
    clock.now = 140.0
    g.add(_stats())
    assert g.samples[0][0] == 40.0


def test_no_line_is_drawn_across_two_requests(qtbot):
    """Issue 36: the next request's samples start a new line (a gap in the curve), so a
    summary's figures and the next question's are not joined."""
    import math

    clock = Clock()
    g = MemoryGraphs(clock=clock)
    qtbot.addWidget(g)
    for t in (101.0, 102.0):
        clock.now = t
        g.add(_stats())
    clock.now = 110.0
    g.start()  # the next question
    g.start()  # twice: one gap, not two
    g.add(_stats())
    xs, ys = g.kv_held.getData()
    assert len(xs) == 4 and math.isnan(ys[2]) and not math.isnan(ys[3])
