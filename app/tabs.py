"""The tabs beside the chat: Graphs, Memory and Settings.

Each chat's view is its own: showing another chat empties the graphs and the
Memory view, and shows again the last memory map of that chat if this run made
one (the last ``MAPS_KEPT`` chats' maps are kept).
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QScrollArea, QTabWidget

from engine.session.trace import MemoryMap

from .graphs import MemoryGraphs
from .memory_view import MemoryView
from .settings import Settings
from .settings_panel import SettingsPanel

MAPS_KEPT = 4


class SideTabs(QTabWidget):
    """Graphs, Memory and Settings (scrolled vertically only)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.graphs = MemoryGraphs()
        self.memory_view = MemoryView()
        self.panel = SettingsPanel(settings)
        scroll = QScrollArea()
        scroll.setWidget(self.panel)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.addTab(self.graphs, "Graphs")
        self.addTab(self.memory_view, "Memory")
        self.addTab(scroll, "Settings")
        self.maps: dict[int, MemoryMap] = {}  # each chat's last memory map, oldest first

    def set_dark(self, dark: bool) -> None:
        self.graphs.set_dark(dark)
        self.memory_view.set_dark(dark)

    def show_chat(self, cid: int | None) -> None:
        """Another chat is shown: nothing of the last one's, its own last map if kept."""
        self.graphs.clear()
        self.memory_view.clear()
        if cid is not None and cid in self.maps:
            self.memory_view.show_map(self.maps[cid])

    def add_map(self, cid: int, memory_map: MemoryMap, *, shown: bool) -> None:
        """Keep chat ``cid``'s latest map; draw it when that chat is ``shown``."""
        self.maps.pop(cid, None)
        self.maps[cid] = memory_map
        while len(self.maps) > MAPS_KEPT:
            self.maps.pop(next(iter(self.maps)))
        if shown:
            self.memory_view.show_map(memory_map)

    def forget(self, cid: int) -> None:
        """A deleted chat's map."""
        self.maps.pop(cid, None)
